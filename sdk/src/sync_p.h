// Sync: the local copy of each conversation and its cursor. Owns the sync
// loop per conversation (pages applied with their cursor), cursor faults,
// the conversation list (`convs`), and the `event` / `hint` pushes.
#pragma once

#include "codec_p.h"

#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QTimer>

#include <optional>

namespace im {

class ClientPrivate;

class Sync : public QObject {
    Q_OBJECT
public:
    explicit Sync(ClientPrivate &d);

    /// Pulls `conv` from its cursor until has_more is false.
    void start(const QString &conv);
    void syncAll();
    /// Asks for the conversation list; with syncAfter, syncs each one listed.
    void requestConvs(bool syncAfter = false);
    /// A coalesced `convs` refresh soon.
    void scheduleConvsRefresh();
    /// Pushed events are applied in batches: all that arrive in one pass of
    /// the event loop go into one SQLite transaction.
    void onEventPush(const proto::Event &ev);
    void onHint(const proto::Hint &h);
    void onResync();
    void sessionEnded();
    void clear() {
        syncs_.clear();
        pushes_.clear();
    }

    int pageSize = 100;

private:
    void onPage(const QString &conv, qint64 after, const proto::Page &page);
    void onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply);
    void onConvs(const std::optional<proto::Incoming> &reply);
    void notifyRecalls(const QString &conv, const QList<proto::Event> &events);
    void applyPushes();

    struct State { bool running = false; bool again = false; };
    ClientPrivate &d;
    QHash<QString, State> syncs_;
    bool syncAfterConvs_ = false;
    QList<proto::Event> pushes_;
    bool pushesQueued_ = false;
    QTimer convsTimer_;
};

} // namespace im
