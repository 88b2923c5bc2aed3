// The local database: SQLite (WAL, synchronous=FULL), schema version table and
// forward migrations. All SQL of the SDK lives in Storage (storage.cpp and
// storage_<table family>.cpp); every write is one short transaction and every
// failure is returned to the caller (never swallowed).
#pragma once

#include "codec_p.h"

#include <QtCore/QHash>
#include <QtCore/QList>
#include <QtCore/QLockFile>
#include <QtCore/QSet>
#include <QtCore/QString>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlQuery>

#include <memory>
#include <optional>

namespace im::detail {

/// A file riding a send (obligation 17): the store's own copy of it is
/// Storage::outgoingFilePath(cmid); what POST /v1/uploads announced, and
/// where its upload stands (table outbox_files, one row per such send).
struct OutboxFile {
    QString name;
    QString mime;
    QString sha256; // 64 lowercase hex digits
    qint64 size = 0;
    QString attId;  // empty: no upload started yet (persisted before the first PUT)
    bool complete = false;
};

struct OutboxRow {
    qint64 id = 0;
    QString cmid;
    QString kind; // "send" | "recall" | "edit" | "react"
    QString conv;
    QString body;   // send, edit
    qint64 target = 0; // recall, edit, react: the target's seq (0: not known yet, see targetCmid)
    qint64 replyTo = 0;  // send: the seq it answers (0: none)
    QString emoji;       // react
    bool on = false;     // react
    /// edit, react of our own message not confirmed yet: its cmid; the
    /// change waits until that message has its seq (obligation 16).
    QString targetCmid;
    qint64 createdAt = 0;   // ms since epoch
    int attempts = 0;
    QString lastError;
    qint64 nextRetryAt = 0; // ms since epoch, 0 = none
    QString owner;          // the credential it was written under (Outbox::credentialOf); empty: none
    std::optional<OutboxFile> file; // send: the file it carries (obligation 17)
};

struct ConvRow {
    QString conv;
    QString kind;
    qint64 epoch = 0; // 0 = unknown (no cursor)
    qint64 after = 0; // cursor: last applied seq
    qint64 head = 0;
    qint64 delivered = 0;
    qint64 read = 0;
    qint64 unread = 0;
    qint64 minSeq = 1;
    qint64 gapTo = 0;       // > 0: events up to this seq were purged before we saw them
    qint64 readPending = 0; // a `read` the server has not confirmed yet
    qint64 lastTs = 0;
};

struct Cursor {
    qint64 after = 0;
    qint64 epoch = 0; // 0 = no cursor yet
};

/// Seqs [lo, hi] of a conversation not downloaded (a history window was
/// taken instead of syncing them); filled on demand.
struct Gap {
    qint64 lo = 0, hi = 0;
    bool operator==(const Gap &) const = default;
};

struct MessageRow {
    double pos = 0; // sort position: the seq, or where an unconfirmed message sits
    qint64 seq = 0; // 0 = not known yet
    QString kind;
    QString sender;
    QString body;
    qint64 ts = 0;
    QString cmid;
    int state = 0;  // im::MessageState
    QString errorCode;
    bool dup = false;
    bool own = false;
    QString user;   // join/leave
    qint64 gapLo = 0, gapHi = 0; // a gap marker row (kind "gap"): seqs not downloaded
    bool held = false; // a held draft (Outbox::isHeld), set by the model
    // Contract section 12 (messages() fills them; pending changes of our
    // outbox are applied on top by the client, see Client::pendingChanges).
    qint64 replyTo = 0;
    QString quoteSender, quoteBody; // the replied-to message, when stored here
    bool quoteKnown = false;
    bool edited = false;
    QList<proto::Reaction> reactions;
    QList<proto::Attachment> attachments; // msg: its files (contract section 12)
    bool changePending = false; // an edit or reaction of ours is still in the outbox
    QString key() const {
        if (gapHi > 0)
            return QStringLiteral("gap:%1").arg(gapLo);
        return cmid.isEmpty() ? QStringLiteral("#%1").arg(seq) : cmid;
    }
    bool operator==(const MessageRow &) const = default;
};

struct LocalMessage {
    QString cmid, kind, conv, body;
    qint64 target = 0;
    qint64 replyTo = 0;
    int state = 0;
    QString errorCode;
    qint64 seq = 0;
    bool dup = false;
};

// The prepared statements of the search index's upkeep (one set per open
// store: they run for every stored event).
struct SearchStatements {
    explicit SearchStatements(const QSqlDatabase &db);
    QSqlQuery indexed, row, probe, ftsInsert, ftsDelete, setId, clearId;
    QSqlQuery before; // insertEvent's fast path: one look before the upsert
    // A page's looks, once per page (Storage::lookAhead): its stored seqs,
    // the recalls stored for them, the search ids taken near its own.
    QSqlQuery pageStored, pageRecalled, pageIds;
    QSqlQuery termInsert; // the vocabulary (search_terms)
    // A conversation's token in the index's conv column (a hash: computed
    // once per conversation, not per message).
    const QString &token(const QString &conv);
    QHash<QString, QString> convTokens;
};

// The statements of the page path (insertEvent(), applyChange(),
// countArrivals(), applyPage()'s cursor), prepared once per open store and
// reused for every event: preparing the upsert again for each event was
// nine tenths of what a page of 200 cost (docs/benchmarks.md, issue 51). Bound by
// position (bindValue(i)), every value each time.
struct PageStatements {
    explicit PageStatements(const QSqlDatabase &db);
    QSqlQuery upsert, attachment, erase, edit, recall, reactionRead, reactionWrite;
    QSqlQuery ensureConv, convEpoch, pageCursor, unreadRead, unreadRecalled, unreadWrite;
    QSqlQuery sentFile; // our sent file's outbox_files row, dropped once its event is stored
};

class Storage {
public:
    static constexpr int SchemaVersion = 10;
    /// How long a statement waits for a database locked by someone else.
    static constexpr int BusyTimeoutMs = 250;

    Storage();
    ~Storage();
    Storage(const Storage &) = delete;
    Storage &operator=(const Storage &) = delete;

    /// Opens (creating the folder and the file if needed) and locks the
    /// store: one process at a time (QLockFile `<path>.lock`). A store
    /// locked by a live process fails at once, lockedByOther() true.
    bool open(const QString &path);
    void close();
    bool lockedByOther() const { return lockedByOther_; }
    bool isOpen() const { return open_; }
    QString path() const { return path_; }
    const QString &lastError() const { return error_; }

    int schemaVersion();
    // dl50: what a stored msg said of attachment `attId` (nullopt: none
    // stored, or a read error: lastError() tells which, empty for none).
    std::optional<proto::Attachment> attachment(const QString &attId);
    std::optional<QString> meta(const QString &key);
    bool setMeta(const QString &key, const QString &value);

    // Outbox. enqueue() writes the outbox row (with row.attempts as its
    // on-the-wire mark) and the timeline row in one committed transaction;
    // it returns the outbox row id, or 0 on failure.
    qint64 enqueue(const OutboxRow &row);
    std::optional<QList<OutboxRow>> loadOutbox();
    // Drafts bound to credential `from` are bound to `to` from now on.
    bool rebindOutbox(const QString &from, const QString &to);
    struct Finish { QString cmid; int state = 0; QString errorCode; qint64 seq = 0; bool dup = false; qint64 epoch = 0; };
    struct Retry { QString cmid; int attempts = 0; QString lastError; qint64 nextRetryAt = 0; };
    // Many answers at once (a flush of pipelined replies): one transaction.
    bool settleOutbox(const QList<Finish> &finished, const QList<Retry> &retries);
    std::optional<LocalMessage> localMessage(const QString &cmid);
    // Records that these outbox rows are about to go on the wire (attempts),
    // one transaction with a flush (synchronous=FULL): after a power cut an
    // entry the server may hold must not look unsent.
    bool markOnWire(const QList<QPair<QString, int>> &cmidAttempts);
    // Obligation 16: an edit of an entry not yet on the wire rewrites its
    // body (outbox and timeline rows, one committed transaction).
    bool rewriteOutboxBody(const QString &cmid, const QString &body);
    // An edit/react waiting for its target's seq got it (targetCmid resolved).
    bool resolveOutboxTarget(const QString &cmid, qint64 target);
    // The seq of our message `cmid` once the server confirmed it (0: not
    // yet, or never: *final says it failed or is unknown).
    qint64 ownSeq(const QString &conv, const QString &cmid, bool *final);
    // The `msg` at (conv, seq) as stored: sender and body (the current one).
    struct Quoted { QString sender, body; bool found = false; };
    Quoted quoted(const QString &conv, qint64 seq);
    // cancel(): the outbox row and its timeline row go, one transaction.
    bool cancelOutbox(const QString &cmid);
    // Obligation 17: where the upload of send `cmid`'s file stands (att_id
    // empty: none; committed with synchronous=FULL before the first PUT).
    bool setOutboxUpload(const QString &cmid, const QString &attId, bool complete);
    // The store's own folder for files ("<database>.files") and the copy
    // of an outgoing file in it.
    QString filesDir() const { return path_ + QStringLiteral(".files"); }
    QString outgoingFilePath(const QString &cmid) const {
        return filesDir() + QStringLiteral("/outgoing/") + cmid;
    }
    // discard(): a Failed/Expired timeline row goes; false if there is none.
    bool discardMessage(const QString &cmid, bool *found);

    // Conversations and cursors.
    std::optional<ConvRow> conversation(const QString &conv);
    std::optional<QList<ConvRow>> conversations();
    // Every stored sync cursor, by conversation (cheap: no event lookups).
    std::optional<QHash<QString, Cursor>> cursors();
    bool upsertConversations(const QList<proto::ConvInfo> &convs);
    bool ensureConversation(const QString &conv);
    // One transaction: events (idempotent on (conv, seq)), markers, cursor.
    bool applyPage(const proto::Page &page);
    // A run of pushed events, in one transaction: each is stored (with
    // cursor = its seq) only if its seq is its conversation's after + 1;
    // applied[i] says whether events[i] was the next one.
    bool applyPushedEvents(const QList<proto::Event> &events, QList<bool> *applied);
    // Drops the cursor (and with dropEvents the local events) of one conversation.
    bool resetConversation(const QString &conv, bool dropEvents);
    bool setDelivered(const QString &conv, qint64 delivered);
    // The user's read marker. Read up to what the badge accounts for
    // (unread_head): nothing is unread. Read part of the way: the badge is
    // counted again from the stored rows in (read, unread_head] when they
    // are all here (no gap, cursor at unread_head, at most
    // kMaxLocalUnreadRange seqs); else it is kept and *serverCountNeeded
    // is set (the caller asks `convs` for the server's count).
    bool setRead(const QString &conv, qint64 read, bool *serverCountNeeded = nullptr);
    static constexpr qint64 kMaxLocalUnreadRange = 1000;
    bool setReadPending(const QString &conv, qint64 seq);
    bool updateHead(const QString &conv, qint64 head);
    // Our own messages that the last committed rebuild found lost by the
    // server (startRebuild()), now back in the outbox, in creation order;
    // the caller hands them to the Outbox. Taking them empties the list.
    QList<OutboxRow> takeRequeued() { return std::exchange(requeued_, {}); }
    // Drops events, conversations and cursors (install reset). Outbox is kept.
    bool resetInstallState(const QString &newInstallId);

    // The timeline rows at or above position `from` (0: all), in order.
    std::optional<QList<MessageRow>> messages(const QString &conv, const QString &self, qint64 from = 0);
    // History windows (contract section 6). One transaction: the window's
    // events, then either (before == 0: the newest window) the cursor moved
    // to the window's head with a gap [gapLo, oldest - 1] left below it, or
    // (before > 0: older events, filling the gap that starts at gapLo) that
    // gap shrunk to what is still missing. An older window of another epoch
    // than the conversation's cursor (reset while the window was on its
    // way) is void: nothing is written, *stale (if given) is set.
    bool applyWindow(const proto::Page &page, qint64 before, qint64 gapLo, bool *stale = nullptr);
    std::optional<QList<Gap>> gaps(const QString &conv);
    // The position from which the `count` newest timeline events below
    // `below` are shown (the lowest of their seqs); 0 if there are none.
    std::optional<qint64> floorFor(const QString &conv, qint64 below, int count);
    // Whether any event lies below `seq` locally.
    std::optional<bool> hasEventsBelow(const QString &conv, qint64 seq);
    std::optional<QList<proto::Event>> events(const QString &conv);
    // cmid of our own message at (conv, seq), empty if none.
    QString cmidAt(const QString &conv, qint64 seq);
    // Whether the event stored at (conv, seq) is our message `cmid` and was
    // recalled: the one row messages() would show as Recalled, looked up
    // alone (Client::messageState, per message, must not read the timeline).
    bool ownEventRecalled(const QString &conv, qint64 seq, const QString &cmid, const QString &self);
    bool clearReadPending(const QString &conv);

    // Test hook: the n-th write statement from now fails (0 disables).
    void injectFaultAfter(int statements) { faultCountdown_ = statements; }
    // Test hook: records the write statements run under synchronous=NORMAL
    // (relaxed) from now on.
    void recordRelaxedWrites(bool on) {
        recordRelaxed_ = on;
        relaxedWrites_.clear();
    }
    const QStringList &relaxedWrites() const { return relaxedWrites_; }
    // Test hook: writes committed with a flush (synchronous=FULL: a Full
    // transaction, or a write statement outside a transaction) so far.
    int flushedCommits() const { return flushedCommits_; }
    // Test hook: the n-th event insert from now fails (0 disables).
    void injectEventInsertFault(int n) { eventFaultCountdown_ = n; }
    // Value of a PRAGMA on this connection (tests, diagnostics).
    QString pragma(const QString &name);

    // Search index (obligation 18, storage_search.cpp). The FTS5 table
    // `search` holds the current text of every stored msg that is not
    // recalled; every write that stores, changes or drops events keeps it
    // in the same transaction (insertEvent, applyChange, the deletes), so a
    // crash never leaves the index and the events apart. A store from
    // before schema 6 gets its index built in bounded batches:
    // buildSearchIndex() until it says finished (Client drives it from its
    // event loop, one batch per turn); searches meanwhile see what is built.
    // Once every row is in (finished), the same calls merge the index's
    // segments into one, a bounded step each (settled when that is done:
    // the bulk build leaves many, and a merged index is smaller and faster).
    struct IndexBuild {
        qint64 done = 0;  // msg rows indexed by the build so far
        qint64 total = 0; // msg rows to index when the build started
        bool finished = false; // every row indexed: searches find everything
        bool settled = false;  // finished, and the segments merged
    };
    std::optional<IndexBuild> buildSearchIndex(int budgetMs);
    // Whether the build has finished (false while a store is being indexed).
    std::optional<bool> searchIndexComplete();
    // Whether the build has nothing left to do (the merge after it done too).
    std::optional<bool> searchIndexSettled();
    // Test hook: what the index holds for (conv, seq): its rowid (0: not indexed).
    qint64 searchIdOf(const QString &conv, qint64 seq);
    // Benchmark hook (bench_search): pages stored without their index upkeep
    // (the cost of a page with and without it). Never off in the SDK.
    void setSearchUpkeep(bool on) { searchUpkeep_ = on; }

private:
    bool exec(QSqlQuery &q);
    bool execSql(const QString &sql);
    // Full: synchronous=FULL (the outbox obligation: survives power loss).
    // Relaxed: synchronous=NORMAL for this transaction only (WAL: atomic and
    // crash-safe, not fsynced) for what can be had again: answers (a resend
    // gets the same answer), events and cursors (a re-sync), markers.
    enum class Durability { Full, Relaxed };
    bool begin(Durability durability = Durability::Full);
    bool commit();
    void restoreDurability();
    // One statement in its own Relaxed transaction.
    bool execRelaxed(QSqlQuery &q);
    // PRAGMA fullfsync on Apple systems (a no-op elsewhere).
    bool appleFullFsync();
    bool relaxed_ = false;
    // A relaxed transaction could not put synchronous=FULL back: the next
    // Full one restores it first, or fails.
    bool durabilityUnknown_ = false;
    void rollback();
    bool migrate();
    bool fail(const QString &what);
    // Inside a transaction: one event row (idempotent on (conv, seq)). A
    // msg's later changes (contract section 12) are kept where the stored
    // row already knows newer ones (edit_seq / reactions_seq); an edit or
    // reaction event is applied to its stored target only above those.
    bool insertEvent(const proto::Event &e, qint64 epoch);
    bool applyChange(const proto::Event &e);
    // A user's erase: the msg's text (body, edit) gone, shown Recalled.
    bool eraseText(const QString &conv, qint64 seq);
    // messages(): each msg row's current body, reply_to and its quote,
    // reactions (contract section 12).
    bool addChanges(const QString &conv, qint64 from, QList<MessageRow> &rows);
    // Inside a transaction, before a page or newest window is stored: the
    // conversation's row exists; if it has no cursor (epoch 0: new, or reset
    // after CURSOR_AHEAD) local events and gaps above the server's `head`
    // go and head becomes that head (a restored server lost them). Our own
    // sent messages above that head (the server lost them too, and their
    // request keys) go back into the outbox with their cmid, Pending
    // (requeued_), so they are sent again, once.
    bool startRebuild(const QString &conv, qint64 head);
    bool requeueLostOwn(const QString &conv, qint64 head);
    // Inside a transaction: the unread badge after `events` were stored
    // (only those above unread_head change it; never a recount).
    bool countArrivals(const QString &conv, const QList<proto::Event> &events);

    // The search index: (un)indexes one stored event by its current row.
    // unindexEvent() must run before a row's text or state changes (the
    // contentless index is told the text it indexed), indexEvent() after.
    bool unindexEvent(const QString &conv, qint64 seq);
    // insertEvent(), before its upsert: a stored row is unindexed (indexed
    // again after the upsert: *isNew false); for a new msg the index row
    // is written now and *newId (0: not indexed) goes into the insert (two
    // statements fewer per new message: the common case).
    bool indexBeforeInsert(const proto::Event &e, bool *isNew, qint64 *newId);
    // What indexBeforeInsert() would look up for each event of a page, read
    // for the whole page at once by lookAhead() (three range reads instead
    // of a statement per event); valid only inside that page's transaction
    // (endLookAhead(), rollback() drop it). A seq outside it, or stored
    // already, takes the per-event look.
    struct PageLooks {
        bool valid = false;
        QString conv;
        qint64 lo = 0, hi = 0;     // the page's seqs
        qint64 idLo = 0, idHi = 0; // the search ids read: every taken one in this range is in takenIds
        QSet<qint64> stored, recalled, takenIds;
    };
    PageLooks looks_;
    bool lookAhead(const QString &conv, const QList<proto::Event> &events);
    void endLookAhead() { looks_ = PageLooks(); }
    // The first free search_id from ts * 2^20 + (seq mod 2^20), or 0 on an error.
    qint64 freeSearchId(qint64 ts, qint64 seq);
    bool indexEvent(const QString &conv, qint64 seq);
    // Unindexes the events of `conv` above seq `above` (-1: all of them).
    bool unindexRange(const QString &conv, qint64 above);
    // After migrate(): an index written by another searchtext::Version is
    // dropped and built again.
    bool checkSearchVersion();
    // One bounded step of the segment merge after the build: true when
    // there was nothing left to merge.
    std::optional<bool> mergeSearchSegments(int budgetMs);
    std::unique_ptr<SearchStatements> search_;
    std::unique_ptr<PageStatements> page_;
    PageStatements &pageStatements();
    bool searchUpkeep_ = true;
    // The vocabulary's entries known to be stored (search_terms): each
    // written once per session. Cleared by a rollback (what it undid).
    QSet<QString> knownTerms_;
    bool noteTerms(const QString &text);
    SearchStatements &searchStatements();

    QString connection_;
    QString path_;
    QString error_;
    bool open_ = false;
    bool lockedByOther_ = false;
    std::unique_ptr<QLockFile> lock_;
    int faultCountdown_ = 0;
    int eventFaultCountdown_ = 0;
    bool recordRelaxed_ = false;
    QStringList relaxedWrites_;
    QList<OutboxRow> requeued_; // requeueLostOwn() in the open transaction
    bool inTransaction_ = false;
    int flushedCommits_ = 0;
    bool eventInsertFault();
};

} // namespace im::detail
