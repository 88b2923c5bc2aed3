// Private side of im::Client. The work is split by job, one part each:
//   Connection (connection_p.h)  session, hello, liveness, request table, retries
//   Outbox     (outbox_p.h)      durable outbox, send order, outcomes
//   Sync       (sync_p.h)        cursors, pages, pushes, conversation list
//   Markers    (markers_p.h)     ack / read markers
// ClientPrivate holds what they share (the store, the identity, the error
// reporting) and wires the session's start and end to the parts.
#pragma once

#include <im/client.h>

#include "codec_p.h"
#include "connection_p.h"
#include "markers_p.h"
#include "outbox_p.h"
#include "storage_p.h"
#include "sync_p.h"

#include <QtCore/QObject>

namespace im {

class ClientPrivate : public QObject {
    Q_OBJECT
public:
    explicit ClientPrivate(Client *q);
    ~ClientPrivate() override;

    static ClientPrivate *get(Client *c) { return c->d.get(); }
    static const ClientPrivate *get(const Client *c) { return c->d.get(); }

    /// Capped exponential backoff with jitter for request retries.
    int backoffMs(int attempt) const;
    void storageFailed(const QString &what);
    void enterStale(const QString &message);
    /// A reply classified EndSession (proto::classify): what ending the
    /// session means for its code (STALE_INSTALL: stale; UNAUTHENTICATED:
    /// the server closes the connection, the next hello reports it).
    void endSession(const std::optional<proto::Incoming> &reply);
    /// A `welcome` named this identity: record it (false on a storage error).
    bool adoptIdentity(const QString &user, const QString &device);

    Client *q;
    detail::Storage storage;
    QString lastError;
    QString userId, deviceId, installId;
    bool stale = false;
    int retryInitialMs = 250;
    int retryMaxMs = 30000;

    Connection conn;
    Outbox outbox;
    Sync sync;
    Markers markers;

Q_SIGNALS:
    /// Internal: the timeline of `conv` may have changed (models reload).
    void timelineChanged(const QString &conv);

private:
    void onSessionStarted();
};

} // namespace im
