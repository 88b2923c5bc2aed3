// The "silent server" fault: a TCP proxy inside the demo app between the
// client and one server. It forwards bytes both ways until silence() is
// called; from then on every connection open at that moment stays open but
// carries nothing more in either direction (the server "stops answering":
// no reply, no push, no pong), as a hung gateway or a NAT box that lost the
// mapping does. Connections made later are forwarded normally, so the SDK's
// keepalive (Client::setKeepAlive) can notice the silence, drop the socket
// and reconnect through the proxy again.
//
// Why in the demo app and not in the server: imserver's fault points
// (server/src/core/faults.hpp) act on requests inside a database transaction;
// none keeps a WebSocket open while answering nothing, pongs included
// (Beast answers pings itself). docs/demo-app.md, "Silent server".
#pragma once

#include <QtCore/QList>
#include <QtCore/QObject>
#include <QtCore/QUrl>

class QTcpServer;
class QTcpSocket;

class FaultProxy : public QObject {
    Q_OBJECT
public:
    /// Forwards to the host and port of `upstream` (ws:// or wss://).
    explicit FaultProxy(const QUrl &upstream, QObject *parent = nullptr);
    ~FaultProxy() override;

    /// Listens on 127.0.0.1 (any free port). False and errorString() on failure.
    bool start();
    QString errorString() const { return error_; }
    /// The upstream URL with host and port replaced by the proxy's.
    QUrl proxiedUrl() const;
    QUrl upstream() const { return upstream_; }

    /// Every connection open now stops forwarding (both ways) and stays open
    /// until the client closes it. Returns how many were silenced.
    int silence();

    int openConnections() const { return int(pairs_.size()); }
    int silencedConnections() const;
    int acceptedConnections() const { return accepted_; }

Q_SIGNALS:
    /// A connection opened, closed, or was silenced.
    void changed();

private:
    struct Pair {
        QTcpSocket *client = nullptr;
        QTcpSocket *server = nullptr;
        QByteArray pending; ///< client bytes before the server socket connected
        bool silent = false;
    };
    void onNewConnection();
    void forward(Pair *p, QTcpSocket *from);
    void drop(Pair *p);

    QUrl upstream_;
    QTcpServer *listener_;
    QList<Pair *> pairs_;
    QString error_;
    int accepted_ = 0;
};
