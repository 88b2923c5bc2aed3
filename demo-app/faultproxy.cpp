#include "faultproxy.h"

#include <QtNetwork/QTcpServer>
#include <QtNetwork/QTcpSocket>

#include <algorithm>

FaultProxy::FaultProxy(const QUrl &upstream, QObject *parent)
    : QObject(parent), upstream_(upstream), listener_(new QTcpServer(this)) {
    connect(listener_, &QTcpServer::newConnection, this, &FaultProxy::onNewConnection);
}

FaultProxy::~FaultProxy() {
    const QList<Pair *> pairs = pairs_;
    pairs_.clear();
    for (Pair *p : pairs) {
        p->client->disconnect(this);
        p->server->disconnect(this);
        p->client->abort();
        p->server->abort();
        delete p;
    }
}

bool FaultProxy::start() {
    if (listener_->isListening())
        return true;
    if (!listener_->listen(QHostAddress::LocalHost, 0)) {
        error_ = listener_->errorString();
        return false;
    }
    return true;
}

QUrl FaultProxy::proxiedUrl() const {
    QUrl u = upstream_;
    u.setHost(QStringLiteral("127.0.0.1"));
    u.setPort(listener_->serverPort());
    return u;
}

int FaultProxy::silence() {
    int n = 0;
    for (Pair *p : pairs_)
        if (!p->silent) {
            p->silent = true;
            p->pending.clear();
            ++n;
        }
    emit changed();
    return n;
}

int FaultProxy::silencedConnections() const {
    return int(std::count_if(pairs_.begin(), pairs_.end(), [](const Pair *p) { return p->silent; }));
}

void FaultProxy::onNewConnection() {
    while (QTcpSocket *c = listener_->nextPendingConnection()) {
        ++accepted_;
        auto *p = new Pair;
        p->client = c;
        p->server = new QTcpSocket(c); // deleted with the client socket
        pairs_.append(p);
        connect(c, &QTcpSocket::readyRead, this, [this, p] { forward(p, p->client); });
        connect(p->server, &QTcpSocket::readyRead, this, [this, p] { forward(p, p->server); });
        connect(p->server, &QTcpSocket::connected, this, [p] {
            if (!p->silent && !p->pending.isEmpty())
                p->server->write(p->pending);
            p->pending.clear();
        });
        // Either side gone: the other goes too. A silenced connection ends
        // only when the client gives up on it (the server is "hung", not gone).
        connect(c, &QTcpSocket::disconnected, this, [this, p] { drop(p); });
        connect(c, &QTcpSocket::errorOccurred, this, [this, p] { drop(p); });
        connect(p->server, &QTcpSocket::disconnected, this, [this, p] {
            if (!p->silent)
                drop(p);
        });
        connect(p->server, &QTcpSocket::errorOccurred, this, [this, p] {
            if (!p->silent)
                drop(p);
        });
        p->server->connectToHost(upstream_.host(),
                                 quint16(upstream_.port(upstream_.scheme() == QLatin1String("wss") ? 443 : 80)));
        emit changed();
    }
}

void FaultProxy::forward(Pair *p, QTcpSocket *from) {
    const QByteArray data = from->readAll();
    if (p->silent)
        return; // swallowed: nothing reaches the other side
    if (from == p->client) {
        if (p->server->state() == QAbstractSocket::ConnectedState)
            p->server->write(data);
        else
            p->pending += data;
    } else {
        p->client->write(data);
    }
}

void FaultProxy::drop(Pair *p) {
    if (!pairs_.removeOne(p))
        return;
    p->client->disconnect(this);
    p->server->disconnect(this);
    p->server->abort();
    p->client->abort();
    p->client->deleteLater(); // and its child, the server socket
    delete p;
    emit changed();
}
