// Private side of im::Client: wires codec, storage and transport together.
#pragma once

#include <im/client.h>

#include "codec_p.h"
#include "storage_p.h"
#include "transport_p.h"

#include <QtCore/QHash>
#include <QtCore/QSet>
#include <QtCore/QTimer>

#include <functional>
#include <map>

namespace im {

class ClientPrivate : public QObject {
    Q_OBJECT
public:
    explicit ClientPrivate(Client *q);
    ~ClientPrivate() override;

    static ClientPrivate *get(Client *c) { return c->d.get(); }
    static const ClientPrivate *get(const Client *c) { return c->d.get(); }

    enum class Req { Hello, Send, Recall, Sync, Ack, Read, Convs, Sub };
    struct Pending {
        Req kind = Req::Hello;
        QString conv;
        QString cmid;
        qint64 seq = 0;
        qint64 deadline = 0;
        bool timedOut = false;
    };
    struct OutItem {
        detail::OutboxRow row;
        bool inFlight = false;
        QString rid;
    };

    // request plumbing
    QString nextRid();
    bool transmit(Req kind, const QString &rid, const QByteArray &frame, const QString &conv = {},
                  const QString &cmid = {}, qint64 seq = 0);
    void onText(const QByteArray &frame);
    void onReply(const QString &rid, Pending p, const std::optional<proto::Incoming> &reply);
    void onTick();
    void onOpened();
    void onClosed();
    void onTransportState();
    int backoffMs(int attempt) const;

    // outbox
    void schedulePump();
    void pump();
    void onOutboxOutcome(const QString &rid, const QString &cmid, const std::optional<proto::Incoming> &reply);
    // Our own events (by cmid) settle their outbox entries, even before the
    // send's reply arrives (a lost reply, or the event came by sync first).
    void settleOwnEvents(const QList<proto::Event> &events);
    QString enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target);

    // sync
    void startSync(const QString &conv);
    void onPage(const Pending &p, const proto::Page &page);
    void onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply);
    void retryLater(const QString &key, std::function<void()> fn);
    void sendAck(const QString &conv);
    void requestConvs();
    void scheduleConvsRefresh();
    void sendPendingReads();

    // pushes
    void onEventPush(const proto::Event &ev);
    void onHint(const proto::Hint &h);

    void enterStale(const QString &message);
    void setState(ConnectionState s);
    void storageFailed(const QString &what);
    void notifyRecalls(const QString &conv, const QList<proto::Event> &events);
    bool isSessionUp() const { return helloDone && state == ConnectionState::Connected; }

    Client *q;
    detail::Storage storage;
    detail::Transport *transport = nullptr;
    QString token;
    QList<QUrl> urls;
    QString lastError;

    ConnectionState state = ConnectionState::Disconnected;
    QString gateway;
    QString userId, deviceId, installId;
    bool stale = false;
    bool offline = false;
    bool wantConnected = false;
    bool helloDone = false;
    bool hadSession = false;
    bool dropNext = false;
    bool pumpQueued = false;

    int requestTimeoutMs = 10000;
    int retryInitialMs = 250;
    int retryMaxMs = 30000;
    int pageSize = 100;
    int window = 64;
    quint64 ridCounter = 0;
    quint64 session = 0;
    bool syncAfterConvs = false;

    QHash<QString, Pending> pending;
    std::map<qint64, OutItem> outbox; // by outbox row id = creation order
    QHash<QString, qint64> outboxIds; // cmid -> row id
    int inFlight = 0;

    struct SyncState { bool running = false; bool again = false; int failures = 0; };
    QHash<QString, SyncState> syncs;
    QHash<QString, int> failures;  // per retry key (convs, read:conv, sub, ...)
    QHash<QString, qint64> ackSent; // conv -> highest seq acked on this connection
    QTimer tick;
    QTimer convsTimer;

Q_SIGNALS:
    /// Internal: the timeline of `conv` may have changed (models reload).
    void timelineChanged(const QString &conv);
};

} // namespace im
