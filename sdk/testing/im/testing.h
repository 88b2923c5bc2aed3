// im::testing: QA hooks of a Client, for the SDK's tests and the demo app's
// fault panel. Not part of the public API, not installed and not exported by
// the shared library (docs/sdk.md, "Testing hooks"): in-tree targets get it
// by linking ImSdk::Testing, a static library beside ImSdk::ImSdk (or
// ImSdk::Internal).
#pragma once

#include <QtCore/qglobal.h>

#include <QtCore/QObject>
#include <QtCore/QPointer>

namespace im {

class Client;

namespace testing {

/**
 * Faults: simulated failures of one Client's connection. Any number of
 * Faults may watch one Client; they share its state (offline is the
 * client's, not the Faults object's). Calls on a destroyed client do nothing.
 */
class Faults : public QObject {
    Q_OBJECT
    /// When true the client stays disconnected (simulated offline): the
    /// socket is closed and no reconnect is tried until it is set false.
    Q_PROPERTY(bool offline READ isOffline WRITE setOffline NOTIFY offlineChanged)
public:
    explicit Faults(Client *client, QObject *parent = nullptr);
    ~Faults() override;

    Client *client() const;
    bool isOffline() const;

public Q_SLOTS:
    /// Go offline (close the socket, no reconnect) or back online.
    void setOffline(bool offline);
    /// Ignore the next reply frame that answers a request (it times out and
    /// counts as "no reply"); replyDropped() says which one it was.
    void dropNextReply();
    /// Drop the socket right now without a close handshake; reconnect applies.
    void closeSocketNow();
    /// One byte of the next file upload request (PUT) is flipped on its way
    /// to the server; the store's copy of the file stays intact. The
    /// server's SHA-256 check at the last byte answers 422 DIGEST_MISMATCH,
    /// the SDK finds its copy unchanged and starts the upload again at 0
    /// (a byte damaged on the wire: the message still goes, once).
    /// uploadChunkCorrupted() says when it happened.
    void corruptNextUploadChunk();

Q_SIGNALS:
    void offlineChanged(bool offline);
    /// The reply dropped by dropNextReply(): its request's `rid` and the
    /// reply's type (`t`: "sent", "error", "acked", ...), so a test can tell
    /// that the reply it meant to lose was the one lost.
    void replyDropped(const QString &rid, const QString &replyType);
    /// corruptNextUploadChunk() flipped a byte of the PUT of sendFile()
    /// entry `cmid` at `offset`.
    void uploadChunkCorrupted(const QString &cmid, qint64 offset);

private:
    QPointer<Client> client_;
};

} // namespace testing
} // namespace im
