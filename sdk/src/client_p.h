// Private side of im::Client. The work is split by job, one part each:
//   Connection (connection_p.h)  session, hello, liveness, request table, retries
//   Outbox     (outbox_p.h)      durable outbox, send order, outcomes
//   Sync       (sync_p.h)        cursors, pages, pushes, conversation list
//   Markers    (markers_p.h)     ack / read markers
//   Ephemeral  (ephemeral_p.h)   typing and presence (nothing stored)
// Dependencies go one way, downwards:
//
//   ClientPrivate (this: owns the parts, wires them, implements their hosts)
//     Outbox   Sync   Markers   Ephemeral   (siblings: none calls another)
//     Connection                (knows nothing above it)
//     detail::Storage, detail::Reporter / Identity / Backoff (shared_p.h)
//
// Each part gets only what it needs in its constructor (the store, the
// connection, the reporter, a read-only view of the identity, the backoff)
// and tells what happened through its own signals; ClientPrivate routes
// them: to the other parts (a pushed event -> Sync, our own stored events ->
// Outbox, an ack due -> Markers, a session to end), to the Client's public
// signals, and to its own private signals, which the models follow.
#pragma once

#include <im/client.h>

#include "codec_p.h"
#include "connection_p.h"
#include "downloads_p.h"
#include "ephemeral_p.h"
#include "markers_p.h"
#include "outbox_p.h"
#include "searchservice_p.h"
#include "shared_p.h"
#include "storage_p.h"
#include "sync_p.h"

#include <QtCore/QObject>
#include <QtCore/QTimer>

namespace im {

/// The QA hooks of one Client (im::testing::Faults), as a child object of
/// the Client named "im.sdk.faults": Faults calls them through the
/// meta-object system, so the shared library exports nothing for them.
class FaultHooks : public QObject {
    Q_OBJECT
public:
    FaultHooks(Connection &conn, Uploader &uploader, QObject *parent);
    Q_INVOKABLE bool isOffline() const;
    Q_INVOKABLE void setOffline(bool offline);
    Q_INVOKABLE void dropNextReply();
    Q_INVOKABLE void closeSocketNow();
    Q_INVOKABLE void corruptNextUploadChunk();
Q_SIGNALS:
    void offlineChanged(bool offline);
    void replyDropped(const QString &rid, const QString &type);
    void uploadChunkCorrupted(const QString &cmid, qint64 offset);
private:
    Connection &conn_;
    Uploader &uploader_;
};

class ClientPrivate : public QObject, private Connection::Host {
    Q_OBJECT
public:
    /// A child of q (see the constructor: the whole client moves with q).
    explicit ClientPrivate(Client *q);
    ~ClientPrivate() override;
    bool event(QEvent *e) override;

    static ClientPrivate *get(Client *c) { return c->d.get(); }
    static const ClientPrivate *get(const Client *c) { return c->d.get(); }

    /// Reports an error: Client::errorOccurred and then errorReported.
    void reportError(const QString &code, const QString &message);
    void storageFailed(const QString &what);
    /// Bad input: lastError and errorOccurred("INVALID_ARGUMENT"); returns an empty cmid.
    QString refuse(const QString &why);
    /// An edit or react (Client::edit/react): by `target` seq, or (target 0)
    /// of our message `cmid`, resolved to its seq or waiting behind it.
    QString enqueueChange(const QString &kind, const QString &conv, qint64 target, const QString &cmid,
                          const QString &body, const QString &emoji, bool on);
    /// The quotes of `rows`' replies (contract section 12) that the store
    /// does not hold: from the ones fetched earlier in this process, else
    /// asked for now (`fetch`, once per message while connected); the
    /// timeline is re-read when one arrives.
    void fillQuotes(const QString &conv, QList<detail::MessageRow> &rows);
    struct Quote { QString sender, body; };
    QHash<QString, Quote> fetchedQuotes; ///< "conv\nseq" -> what `fetched` said
    QSet<QString> quotesAsked;
    void enterStale(const QString &message);
    /// A reply classified EndSession (proto::classify): what ending the
    /// session means for its code (STALE_INSTALL: stale; UNAUTHENTICATED:
    /// the server closes the connection, the next hello reports it).
    void endSession(const std::optional<proto::Incoming> &reply);

    Client *q;
    detail::Reporter reporter;    ///< lastError and every part's reports
    detail::Identity id;          ///< written here only; the parts read it
    detail::Backoff retryBackoff; ///< setRetryBackoff()
    detail::Storage storage;
    QString trustedCaFile, pinnedSha256; // as the app gave them (properties)
    qint64 maxFileSize = 104857600;      ///< sendFile()'s limit (client_files.cpp)
    /// Copies of outgoing files that no outbox entry names (a crash between
    /// the copy and the outbox write, or after the entry's end): removed
    /// at open() (client_files.cpp).
    void removeOrphanCopies();

    Connection conn;
    FaultHooks *faultHooks = nullptr; ///< a child of q, deleted with us (it refers to conn)
    Outbox outbox;
    Sync sync;
    Markers markers;
    Ephemeral ephemeral;

    // On-device search (obligation 18): the search thread, started by the
    // first Client::search(), ended by close(); the index build of an older
    // store, one bounded batch per event-loop turn.
    std::unique_ptr<detail::SearchService> search;
    QTimer indexBuild;
    double indexProgress = 1.0;
    void startIndexBuild();
    void buildIndexStep();

    // Files received (dl50, obligation 17; client_downloads.cpp): a child
    // of this object, made by the constructor.
    detail::Downloads *downloads = nullptr;
    void setUpDownloads();

Q_SIGNALS:
    // What the models follow (never the Client's own signals, which an app
    // may disconnect): see the constructor.
    /// The timeline of `conv` may have changed (models reload).
    void timelineChanged(const QString &conv);
    /// The app's own send()/recall() wrote a pending row into `conv`: the
    /// models show it before the call returns (obligation 1).
    void draftWritten(const QString &conv);
    /// Forwarded to Client::conversationsChanged.
    void conversationsChanged();
    /// Forwarded to Client::identityChanged.
    void identityChanged();
    /// Who is typing in `conv` changed (Ephemeral::typists()).
    void typingChanged(const QString &conv, const QStringList &users);
    /// ~Client has begun: the models drop their link to it.
    void aboutToBeDestroyed();
    /// The search index's build progressed or finished (SearchModel).
    void searchIndexChanged();

private:
    void onSessionStarted(const QString &helloToken);
    // Connection::Host
    bool mayConnect() const override { return storage.isOpen() && !id.stale; }
    QString installId() const override { return id.installId; }
    /// A `welcome` named this identity: record it (false on a storage
    /// error, or another user's store: refused).
    bool acceptIdentity(const QString &user, const QString &device) override;
};

} // namespace im
