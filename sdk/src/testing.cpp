// im::testing::Faults over the Client's internal hook object (FaultHooks in
// client_p.h, a child of the Client named "im.sdk.faults"), reached through
// the meta-object system: no symbol of the SDK's internals is needed, so the
// shared library exports none (docs/sdk.md, "Testing hooks").
#include <im/testing.h>

#include <im/client.h>

namespace im::testing {
namespace {

QObject *hooksOf(Client *client) {
    return client ? client->findChild<QObject *>(QStringLiteral("im.sdk.faults"), Qt::FindDirectChildrenOnly)
                  : nullptr;
}

void call(Client *client, const char *method) {
    if (QObject *h = hooksOf(client))
        QMetaObject::invokeMethod(h, method, Qt::DirectConnection);
}

} // namespace

Faults::Faults(Client *client, QObject *parent) : QObject(parent), client_(client) {
    if (QObject *h = hooksOf(client)) {
        connect(h, SIGNAL(offlineChanged(bool)), this, SIGNAL(offlineChanged(bool)));
        connect(h, SIGNAL(replyDropped(QString, QString)), this, SIGNAL(replyDropped(QString, QString)));
        connect(h, SIGNAL(uploadChunkCorrupted(QString, qint64)), this, SIGNAL(uploadChunkCorrupted(QString, qint64)));
    }
}

Faults::~Faults() = default;

Client *Faults::client() const { return client_; }

bool Faults::isOffline() const {
    bool offline = false;
    if (QObject *h = hooksOf(client_))
        QMetaObject::invokeMethod(h, "isOffline", Qt::DirectConnection, Q_RETURN_ARG(bool, offline));
    return offline;
}

void Faults::setOffline(bool offline) {
    if (QObject *h = hooksOf(client_))
        QMetaObject::invokeMethod(h, "setOffline", Qt::DirectConnection, Q_ARG(bool, offline));
}

void Faults::dropNextReply() { call(client_, "dropNextReply"); }

void Faults::closeSocketNow() { call(client_, "closeSocketNow"); }

void Faults::corruptNextUploadChunk() { call(client_, "corruptNextUploadChunk"); }

} // namespace im::testing
