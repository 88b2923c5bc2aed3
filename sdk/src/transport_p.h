// The transport: the only code in the SDK that touches QWebSocket. It owns
// the socket, the reconnect timer (capped exponential backoff with jitter)
// and the rotation through the configured server URLs.
#pragma once

#include <QtCore/QDateTime>
#include <QtCore/QList>
#include <QtCore/QObject>
#include <QtCore/QPointer>
#include <QtCore/QTimer>
#include <QtCore/QUrl>
#include <QtCore/QVariant>
#include <QtNetwork/QAbstractSocket>
#include <QtNetwork/QSslCertificate>
#include <QtNetwork/QSslError>

class QWebSocket;

namespace im::detail {

class Transport : public QObject {
    Q_OBJECT
public:
    enum class State { Idle, Connecting, Open, Waiting };
    Q_ENUM(State)

    explicit Transport(QObject *parent = nullptr);
    ~Transport() override;

    void setUrls(const QList<QUrl> &urls);
    void setBackoff(int initialMs, int maxMs);
    void setOpenTimeout(int ms) { openTimeoutMs_ = ms; }
    /// wss:// trust: these CA certificates instead of the system's store
    /// (empty: the system's store). Never ignores a TLS error.
    void setTrustedCas(const QList<QSslCertificate> &cas) { trustedCas_ = cas; }
    /// wss:// pin: the server's certificate must have this SHA-256 digest
    /// (32 bytes; empty: no pin). A pinned certificate is trusted even when
    /// self-signed or not issued for the host name.
    void setPinnedSha256(const QByteArray &digest) { pinnedSha256_ = digest; }
    /// The trust above, for the other connections to the same server (the
    /// uploads over HTTPS: same CAs, same pin).
    const QList<QSslCertificate> &trustedCas() const { return trustedCas_; }
    /// Whether `errors` are only what a pinned `peer` certificate excuses.
    bool pinnedOnly(const QSslCertificate &peer, const QList<QSslError> &errors) const;
    const QByteArray &pinnedSha256() const { return pinnedSha256_; }

    /// Starts connecting to the current URL and keeps reconnecting on loss.
    void start();
    /// Closes the socket and stops reconnecting.
    void stop();
    /// Server asked us to go (goaway): move to the next URL and reconnect
    /// after `delayMs`.
    void moveToNextServer(int delayMs);
    /// Drops the socket now (no close handshake); reconnect logic applies.
    void abortNow();
    /// The system reports the network reachable again (QNetworkInformation,
    /// where the platform has a backend): a reconnect waiting for its backoff
    /// is tried at once, with the backoff from the start.
    void onNetworkReachable();
    /// The system's network path changed (another transport medium, e.g.
    /// Wi-Fi to Ethernet): an open socket or an attempt may be bound to a
    /// route that is gone, so it is dropped and the same server is tried at
    /// once, rather than waiting for the liveness timeout.
    void onNetworkPathChanged();
    /// Call once the session is established (hello answered): the next loss
    /// starts the backoff from the beginning again.
    void resetBackoff() { failures_ = 0; }

    /// False if not open, or if the frame is over MaxOutgoingBytes (never sent).
    bool sendText(const QByteArray &frame);
    /// The contract's MAX_FRAME: nothing larger goes on the wire.
    static constexpr qint64 MaxOutgoingBytes = 64 * 1024;
    /// A WebSocket ping; the pong shows up as activity().
    void ping();
    /// An option of the open TCP socket (diagnostics, tests); invalid if none.
    QVariant socketOption(QAbstractSocket::SocketOption option) const;
    /// Largest frame/message accepted from the server (defensive: the server
    /// never sends more than 64 KiB; an older one may send a little more).
    static constexpr qint64 MaxIncomingBytes = 4 * 1024 * 1024;
    /// Test hook: another limit for the next sockets (e.g. MAX_FRAME, to prove
    /// the server keeps to it).
    void setMaxIncomingBytes(qint64 bytes) { maxIncoming_ = bytes; }
    qint64 maxIncomingBytes() const { return maxIncoming_; }
    int initialBackoffMs() const { return initialMs_; }
    int maxBackoffMs() const { return maxMs_; }

    State state() const { return state_; }
    QUrl currentUrl() const;
    QDateTime nextAttemptAt() const { return nextAttemptAt_; }
    bool isRunning() const { return running_; }
    /// The close code the server sent when it closed the last socket (a
    /// WebSocket close frame), 0 when the socket ended any other way. Valid
    /// while closed() is emitted.
    int lastCloseCode() const { return closeCode_; }

signals:
    void opened();
    void closed();
    void textReceived(const QByteArray &frame);
    /// Something arrived on the open socket (a frame or a pong).
    void activity();
    void stateChanged(im::detail::Transport::State state);
    /// The server's certificate was not trusted or the TLS handshake failed.
    /// The attempt counts as lost: the next one follows after the backoff.
    void tlsFailed(const QString &message);

private:
    void attempt();
    void onLost();
    void scheduleReconnect(int delayMs);
    void setState(State s);
    void dropSocket();
    void failTls(const QString &message);

    QList<QUrl> urls_;
    int urlIndex_ = 0;
    int initialMs_ = 500;
    int maxMs_ = 30000;
    int openTimeoutMs_ = 10000;
    int failures_ = 0;
    int closeCode_ = 0;
    qint64 maxIncoming_ = MaxIncomingBytes;
    bool running_ = false;
    State state_ = State::Idle;
    QDateTime nextAttemptAt_;
    QList<QSslCertificate> trustedCas_;
    QByteArray pinnedSha256_;
    QPointer<QWebSocket> socket_;
    QTimer reconnectTimer_{this};
    QTimer openTimer_{this};
};

} // namespace im::detail
