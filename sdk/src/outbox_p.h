// Outbox: the durable queue of send/recall requests and the order in which
// they go on the wire. Owns the in-memory image of the outbox table, the send
// window, the per-conversation order (obligation 9), and the classification
// of each request's outcome into a final timeline state or a retry.
//
// Order (obligation 9): entries of one conversation go out in creation
// order, pipelined: several may be on the wire at once, each send naming as
// `prev` the entry before it that is still unanswered. The server appends a
// send only once its `prev` is committed (else UNAVAILABLE, nothing written),
// so when entry k fails, k+1.. already on the wire cannot overtake it. An
// entry waiting for its retry holds back its conversation; other
// conversations go on. A send refused behind an unanswered `prev` is due
// again at once (it waits behind k in the walk, not on its own timer); only
// an entry sent with no `prev` backs off. A recall, an edit and a react
// (changes, obligation 16) go alone: each waits for every earlier entry of
// its conversation to be answered, and later ones wait for it. A change of
// our own message not confirmed yet names it by cmid (targetCmid) and goes
// once that message has its seq; if the message failed, so does the change
// (NOT_FOUND, nothing sent). At most `window` requests are on the wire in all, at most
// half of them of one conversation, and the walk over conversations starts
// one further on each time (a big backlog does not starve the others).
//
// Answers are settled in batches: every final answer and retry that arrives
// in one pass of the event loop is written in one SQLite transaction.
//
// Layering: above Connection (it sends through it) and Storage; it reads the
// client's identity and reports through detail::Reporter; what it tells the
// client (states, outbox and timeline changes, a session to end) it emits.
#pragma once

#include <im/types.h>

#include "codec_p.h"
#include "shared_p.h"
#include "storage_p.h"
#include "upload_p.h"

#include <QtCore/QElapsedTimer>
#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QSet>
#include <QtCore/QTimer>

#include <map>
#include <optional>
#include <set>

namespace im {

class Connection;

class Outbox : public QObject {
    Q_OBJECT
public:
    struct Item {
        detail::OutboxRow row;
        bool inFlight = false;
        bool settling = false; ///< final answer taken, its write is queued
        QString rid;
        QString sentPrev;      ///< the `prev` the attempt on the wire names (empty: none)
        qint64 dueAt = 0;      ///< monotonic ms (clock()) of the next attempt; 0: due
        bool held = false;     ///< written as another user than this store's (computeHeld())
        /// The on-the-wire mark on disk (the row's `attempts` column): at
        /// least row.attempts; one more while an attempt's mark was written
        /// with the entry (enqueue) and that attempt has not left yet.
        int markedAttempts = 0;
        qint64 uploaded = 0;   ///< a file's bytes at the server as far as known (uploadProgress)
        /// A send carrying a file whose upload is not complete yet: it (and
        /// what follows it in its conversation) waits (obligation 17).
        bool uploading() const { return row.file && !row.file->complete; }
    };

    Outbox(detail::Storage &storage, Connection &conn, detail::Reporter &reporter, const detail::Identity &identity,
           const detail::Backoff &retryBackoff);

    /// Loads the rows of a freshly opened database (creation order).
    void load(const QList<detail::OutboxRow> &rows);
    void clear();
    /// Commits a send/recall request and queues it; returns its cmid or empty.
    QString enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target);
    /// Commits any request (row: kind, conv and its fields; cmid, owner,
    /// created_at are filled here) and queues it; returns its cmid or empty.
    QString enqueue(detail::OutboxRow row);
    /// Obligation 16: our send `cmid` is still in the outbox and no attempt
    /// of it has gone on the wire: its body becomes `body` (one request, the
    /// new body): Done. NotUnsent if it is not such an entry (unknown, not
    /// a send, or an attempt may be on the wire); Failed on a storage error
    /// (reported).
    enum class Rewrite { Done, NotUnsent, Failed };
    Rewrite rewriteUnsent(const QString &cmid, const QString &body);
    /// Obligation 16: our edits and reactions of `conv` still in the outbox
    /// shown on `rows` at once (body, edited, reactions; changePending).
    void showPendingChanges(const QString &conv, QList<detail::MessageRow> &rows) const;
    /// Recall, edit and react: they go alone, once their target has its seq.
    static bool isChange(const QString &kind) {
        return kind == u"recall" || kind == u"edit" || kind == u"react";
    }
    /// Makes every entry due now and sends what the window allows.
    void resendPending();
    /// Puts due entries on the wire (session up, window and order permitting)
    /// and arms the retry timer for the next entry that is not due yet.
    void pump();
    void schedulePump();
    /// Our own events (by cmid) settle their entries, even before the send's
    /// reply arrives (a lost reply, or the event came by sync first).
    void settleOwnEvents(const QList<proto::Event> &events);

    /// Drops an entry no attempt of which has gone on the wire (timeline row
    /// too). False (lastError set) if it is unknown or may have been sent.
    bool cancel(const QString &cmid);

    /// The credential a draft written under `token` belongs to (obligation
    /// 10, issue 26 item 13): "user:<sub>" for a JWT (its `sub`, read offline,
    /// signature unchecked: only the server can check it), else
    /// "token:<SHA-256 of the token>"; empty without a token.
    static QString credentialOf(const QString &token);
    /// The owner a draft written under `token` gets now: credentialOf(),
    /// except that an opaque token a welcome has proven (or the app handed
    /// over as the same user) names that user ("user:<id>"). Never the
    /// store's user for an unproven token (issue 48).
    QString ownerOf(const QString &token) const;
    /// A session was accepted for the identity's user under `helloToken`
    /// (the token its `hello` carried, not the current one): that token is
    /// proven to be this user's (kept in the store), and its drafts are that
    /// user's from now on. Returns false on a storage error.
    bool bindCredential(const QString &helloToken);
    /// The app replaced `previous` with `next`. Only when it says they are
    /// the same user (`sameUser`) does anything move: an unproven opaque
    /// `previous`'s drafts go with `next`; a proven (or JWT) `previous`
    /// proves an opaque `next`; two JWTs with different `sub`s move nothing.
    /// Without `sameUser` drafts stay with the credential they were written
    /// under. Returns false on a storage error.
    bool handOver(const QString &previous, const QString &next, bool sameUser);
    /// Whether `item` may go on the wire in the current session: written
    /// under no credential (before schema 4), or under this session's user.
    bool belongsToSession(const Item &item) const;
    /// Entries held (Item::held): written as another user than the store's
    /// (or, in a store no welcome named yet, under another token than the
    /// current one). They never go out in this store's sessions until a
    /// welcome under their own token proves them this user's.
    int heldCount() const;
    bool isHeld(const QString &cmid) const;
    /// Drops every held entry (outbox and timeline rows). Returns how many,
    /// or -1 on a storage error (reported).
    int discardHeld();
    /// Recomputes Item::held of every entry (after the token or the store's
    /// user changed), with row-level notifications for what changed.
    void updateHeld();

    /// What the API shows of one entry (Client::outbox(), OutboxModel).
    static OutboxEntry toEntry(const Item &item);
    /// The entry with outbox row id `id`, or nullptr.
    const Item *find(qint64 id) const {
        const auto it = items_.find(id);
        return it == items_.end() ? nullptr : &it->second;
    }

    bool contains(const QString &cmid) const { return ids_.contains(cmid); }
    /// The entry `cmid`, or nullptr.
    const Item *findCmid(const QString &cmid) const {
        const auto it = ids_.constFind(cmid);
        return it == ids_.cend() ? nullptr : &items_.at(*it);
    }
    /// Obligation 17: the HTTP side of files (one upload at a time).
    Uploader &uploader() { return uploader_; }
    int size() const { return int(items_.size()); }
    const std::map<qint64, Item> &items() const { return items_; }
    int window = 128; ///< unanswered outbox requests on the connection, all conversations together

Q_SIGNALS:
    // Row-level change notifications (OutboxModel follows them row by row).
    /// Entry `id` was added (ids grow: it is the newest).
    void entryAdded(qint64 id);
    /// What an OutboxEntry shows of entry `id` changed (attempts, in flight,
    /// last error, next retry).
    void entryChanged(qint64 id);
    /// Entry `id` leaves the outbox; it is still in items() during the call.
    void entryAboutToBeRemoved(qint64 id);
    /// All entries were replaced (a database opened or closed).
    void entriesReset();
    // What the client tells the app (Client's signals of the same names).
    void messageStateChanged(const QString &conv, const QString &cmid, qint64 seq, im::MessageState state,
                             const QString &errorCode);
    void outboxChanged();
    /// The timeline of `conv` changed (the models reload).
    void timelineChanged(const QString &conv);
    /// A send() or recall() of the app wrote its pending row into `conv`'s
    /// timeline (obligation 1: shown at once, not after the coalescing delay).
    void draftWritten(const QString &conv);
    /// heldCount() changed.
    void heldChanged(int count);
    /// `sent` of `total` bytes of the file of send `cmid` are at the server.
    void uploadProgress(const QString &cmid, qint64 sent, qint64 total);
    /// classify() said EndSession: the entry stays, the session ends
    /// (what that means for the code is the client's decision).
    void sessionMustEnd(const std::optional<im::proto::Incoming> &reply);

private:
    // Drafts bound to credential `from` become bound to `to` (storage first).
    bool rebind(const QString &from, const QString &to);
    // `credential` (an opaque token's) is `user`'s: remembered in the store's
    // meta table, and its drafts bound to that user.
    bool prove(const QString &credential, const QString &user);
    static QString provenKey(const QString &credential);
    bool computeHeld(const Item &item) const;
    // Whether the next pump() puts `item` (not yet in items_) on the wire: a
    // session of its user is up, and nothing of its conversation, the window
    // or a recall holds it back. Mirrors pump()'s walk; when it says yes the
    // entry's on-the-wire mark is written in the enqueue transaction (one
    // flush per send, issue 48). A wrong yes (the session fell in between)
    // only leaves an unsent entry marked as possibly sent.
    bool goesOutAtOnce(const Item &item) const;
    void noteHeld(); // heldChanged() if the count moved
    // Obligation 17: the oldest upload of this session's entries, when the
    // uploader is free; an upload's verdicts.
    void startUpload();
    void onUploaded(const QString &cmid, const QString &attId);
    void onUploadFailed(const QString &cmid, const QString &code, const QString &message);
    void onOutcome(const QString &rid, const QString &cmid, const std::optional<proto::Incoming> &reply);
    // A change naming its target by cmid: Ready once the target's seq is
    // known (row.target set), Wait while the target is still in the outbox,
    // Failed (the entry is failed with NOT_FOUND) if it never will be.
    enum class Target { Ready, Wait, Failed };
    Target resolveTarget(Item &item);
    void transmit(Item &item, const QString &prev);
    /// `waitMs`: the server asked for at least this wait (RATE_LIMITED's retry_ms).
    void retry(Item &item, const QString &lastError, qint64 waitMs = 0);
    void scheduleFlush();
    void flush();
    void forget(qint64 id);
    qint64 now() const { return clock_.elapsed(); }

    detail::Storage &storage_;
    Connection &conn_;
    detail::Reporter &reporter_;
    const detail::Identity &id_;
    const detail::Backoff &backoff_;
    std::map<qint64, Item> items_;              // by outbox row id = creation order
    QHash<QString, qint64> ids_;                // cmid -> row id
    QHash<QString, std::set<qint64>> convs_;    // conv -> its row ids, in order
    QList<detail::Storage::Finish> finished_;   // answers waiting for the batched write
    QList<detail::Storage::Retry> retries_;
    mutable QHash<QString, QString> proven_;    // "token:<hex>" -> its proven user ("": not proven)
    int lastHeld_ = 0;
    int inFlight_ = 0;
    quint64 rotor_ = 0;                         // where pump()'s walk over conversations starts
    bool pumpQueued_ = false;
    bool flushQueued_ = false;
    QElapsedTimer clock_;                       // monotonic: wall-clock jumps do not matter
    QTimer retryTimer_{this};
    Uploader uploader_;
};

} // namespace im
