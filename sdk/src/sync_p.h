// Sync: the local copy of each conversation and its cursor. Owns the sync
// loop per conversation (pages applied with their cursor), cursor faults,
// the conversation list (`convs`), and the `event` / `hint` pushes.
//
// Layering: above Connection and Storage, beside Outbox and Markers (it
// does not call them: what they must do about stored events, it emits and
// the client routes: ownEventsStored -> Outbox, ackDue -> Markers).
#pragma once

#include "codec_p.h"
#include "shared_p.h"
#include "storage_p.h"

#include <im/types.h>

#include <QtCore/QElapsedTimer>
#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QQueue>
#include <QtCore/QSet>
#include <QtCore/QTimer>

#include <optional>

namespace im {

class Connection;

class Sync : public QObject {
    Q_OBJECT
public:
    Sync(detail::Storage &storage, Connection &conn, detail::Reporter &reporter, const detail::Identity &identity);

    /// Pulls `conv` from its cursor until has_more is false. At most
    /// maxConcurrent conversations sync at once; the others wait their turn.
    void start(const QString &conv);
    void syncAll();
    /// Loads the window of events below `before` (filling the gap that
    /// starts at gapLo); windowLoaded() tells when it is done.
    void loadOlder(const QString &conv, qint64 before, qint64 gapLo);
    /// Walks the conversation list (`convs`, page by page); with syncAfter,
    /// syncs each listed one whose head or epoch moved past its cursor.
    void requestConvs(bool syncAfter = false);
    /// A coalesced `convs` refresh soon: 200 ms from now, and never sooner
    /// than convsMinIntervalMs after the last walk started.
    void scheduleConvsRefresh();
    /// Pushed events are applied in batches: all that arrive in one pass of
    /// the event loop go into one SQLite transaction.
    void onEventPush(const proto::Event &ev);
    void onHint(const proto::Hint &h);
    void onResync();
    void sessionEnded();
    void clear() {
        older_.clear();
        syncs_.clear();
        pushes_.clear();
        queue_.clear();
        queued_.clear();
        active_.clear();
    }
    int activeSyncs() const { return int(active_.size()); }
    int peakActiveSyncs() const { return peakActive_; }
    /// Sync requests sent (diagnostics, tests).
    quint64 syncRequests() const { return syncRequests_; }
    bool isWalkingConvs() const { return convsRunning_; }
    /// `convs` walks started (diagnostics, tests).
    quint64 convsWalks() const { return walks_; }
    /// A refresh is scheduled (its timer runs, or it waits for the walk
    /// under way): diagnostics, tests.
    bool convsRefreshPending() const { return convsTimer_.isActive() || refreshAfterWalk_; }

    int pageSize = 100;
    int convsPageSize = 100;
    int maxConcurrent = 4;
    /// Events per history window (opening, older pages, gap fills).
    int historyWindow = 100;
    /// A conversation more than this many events behind (or new to this
    /// install) is opened with its newest window, not synced from its
    /// cursor; what lies between stays a gap. <= 0: always sync everything.
    int backlogLimit = 1000;
    /// A refresh of the conversation list (scheduleConvsRefresh(): an
    /// unknown conversation, a read the stored rows cannot count) starts no
    /// sooner than this after the previous walk started.
    int convsMinIntervalMs = 3000;

Q_SIGNALS:
    /// A loadOlder() finished (ok: its window is stored).
    void windowLoaded(const QString &conv, bool ok);
    /// Events were stored: our own among them settle their outbox entries
    /// (emitted first, before anything else is told).
    void ownEventsStored(const QList<im::proto::Event> &events);
    /// A rebuild found our own messages that the server lost (a restore)
    /// and put them back into the outbox table (Storage::requeueLostOwn):
    /// the outbox takes them and sends them again with their cmid.
    void ownMessagesRequeued(const QList<im::detail::OutboxRow> &rows);
    /// `conv`'s cursor moved: its delivery marker is due.
    void ackDue(const QString &conv);
    /// A reply said EndSession (classify()): the client decides what that means.
    void sessionMustEnd(const std::optional<im::proto::Incoming> &reply);
    // What the client tells the app (Client's signals of the same names).
    void eventsApplied(const QString &conv, qint64 fromSeq, qint64 toSeq);
    void conversationReset(const QString &conv);
    void conversationSynced(const QString &conv);
    void conversationsChanged();
    void messageStateChanged(const QString &conv, const QString &cmid, qint64 seq, im::MessageState state,
                             const QString &errorCode);
    /// The timeline of `conv` changed (the models reload).
    void timelineChanged(const QString &conv);

public:

private:
    void onPage(const QString &conv, qint64 after, const proto::Page &page);
    void onWindow(const QString &conv, qint64 gapLo, qint64 epoch, const proto::Page &page);
    void onOlder(const QString &conv, qint64 before, qint64 gapLo, const std::optional<proto::Incoming> &reply);
    void handOverRequeued();
    /// Events applied from a page or window: outbox, signals, ack.
    void applied(const QString &conv, const QList<proto::Event> &events);
    void onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply);
    void requestConvsPage(const QString &after);
    void onConvs(const std::optional<proto::Incoming> &reply);
    /// The run of `conv` is over (synced, failed, or waiting for a retry):
    /// its slot goes to the next queued conversation.
    void release(const QString &conv);
    void launch(const QString &conv);
    void notifyRecalls(const QString &conv, const QList<proto::Event> &events);
    void applyPushes();

    struct State { bool running = false; bool again = false; };
    detail::Storage &storage_;
    Connection &conn_;
    detail::Reporter &reporter_;
    const detail::Identity &id_;
    QHash<QString, State> syncs_;
    bool syncAfterConvs_ = false;
    bool convsRunning_ = false;
    bool convsAgain_ = false;
    bool walkSyncs_ = false;  // the running walk syncs what moved
    bool refreshAfterWalk_ = false; // a refresh came due during a walk
    quint64 walks_ = 0;
    QElapsedTimer lastWalk_;  // since the last walk started (monotonic)
    QString convsAfter_;      // `after` of the convs page being answered
    QQueue<QString> queue_;   // waiting for a slot, in request order
    QSet<QString> queued_;
    QSet<QString> active_;    // holding a slot
    QSet<QString> older_;     // a loadOlder() in flight
    int peakActive_ = 0;
    quint64 syncRequests_ = 0;
    QList<proto::Event> pushes_;
    bool pushesQueued_ = false;
    QTimer convsTimer_{this};
};

} // namespace im
