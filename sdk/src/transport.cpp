#include "transport_p.h"

#include "downloads_p.h"

#include "logging_p.h"

#include <QtCore/QRandomGenerator>
#include <QtCore/QVariant>
#include <QtNetwork/QAbstractSocket>
#include <QtNetwork/QNetworkInformation>
#include <QtCore/QCryptographicHash>
#include <QtNetwork/QSslConfiguration>
#include <QtNetwork/QSslError>
#include <QtWebSockets/QWebSocket>

#include <algorithm>

namespace im::detail {

Transport::Transport(QObject *parent) : QObject(parent) {
    reconnectTimer_.setSingleShot(true);
    connect(&reconnectTimer_, &QTimer::timeout, this, &Transport::attempt);
    // Network changes, where Qt has a backend for this platform (Network
    // Manager on Linux, the system APIs on Windows and macOS); without one
    // the liveness watchdog and the backoff still recover, only later.
    if (QNetworkInformation::loadBackendByFeatures(QNetworkInformation::Feature::Reachability)) {
        QNetworkInformation *info = QNetworkInformation::instance();
        connect(info, &QNetworkInformation::reachabilityChanged, this, [this](QNetworkInformation::Reachability r) {
            if (r != QNetworkInformation::Reachability::Disconnected && r != QNetworkInformation::Reachability::Unknown)
                onNetworkReachable();
        });
        if (info->supports(QNetworkInformation::Feature::TransportMedium))
            connect(info, &QNetworkInformation::transportMediumChanged, this, &Transport::onNetworkPathChanged);
    }
    openTimer_.setSingleShot(true);
    connect(&openTimer_, &QTimer::timeout, this, [this] {
        // The handshake did not finish in time: count it as a lost attempt.
        if (state_ == State::Connecting)
            onLost();
    });
}

Transport::~Transport() {
    running_ = false;
    dropSocket();
}

void Transport::setUrls(const QList<QUrl> &urls) {
    urls_ = urls;
    urlIndex_ = 0;
}

void Transport::setBackoff(int initialMs, int maxMs) {
    initialMs_ = std::max(1, initialMs);
    maxMs_ = std::max(initialMs_, maxMs);
}

QUrl Transport::currentUrl() const {
    if (urls_.isEmpty())
        return {};
    return urls_.at(urlIndex_ % urls_.size());
}

void Transport::setState(State s) {
    if (state_ == s)
        return;
    state_ = s;
    emit stateChanged(s);
}

void Transport::start() {
    if (running_)
        return;
    running_ = true;
    failures_ = 0;
    attempt();
}

void Transport::stop() {
    running_ = false;
    reconnectTimer_.stop();
    openTimer_.stop();
    nextAttemptAt_ = {};
    // No socket while Open: stop() called from a closed() handler, which
    // already told the loss.
    const bool wasOpen = state_ == State::Open && socket_;
    dropSocket();
    setState(State::Idle);
    if (wasOpen)
        emit closed();
}

void Transport::dropSocket() {
    if (!socket_)
        return;
    QWebSocket *s = socket_;
    socket_ = nullptr;
    s->disconnect(this);
    s->abort();
    s->deleteLater();
}

void Transport::attempt() {
    reconnectTimer_.stop();
    nextAttemptAt_ = {};
    if (!running_)
        return;
    dropSocket();
    if (urls_.isEmpty()) {
        scheduleReconnect(-1);
        return;
    }
    auto *s = new QWebSocket(QString(), QWebSocketProtocol::VersionLatest, this);
    socket_ = s;
    // Defensive limit for what the server sends (a page of large events may
    // exceed the 64 KiB the client itself never sends over).
    s->setMaxAllowedIncomingFrameSize(quint64(maxIncoming_));
    s->setMaxAllowedIncomingMessageSize(quint64(maxIncoming_));
    connect(s, &QWebSocket::connected, this, [this, s] {
        if (s != socket_)
            return;
        openTimer_.stop();
        if (!pinnedSha256_.isEmpty() && s->sslConfiguration().peerCertificate().digest(QCryptographicHash::Sha256) != pinnedSha256_)
            return failTls(QStringLiteral("the server's certificate does not have the pinned SHA-256 fingerprint"));
        // Small request/reply frames: no Nagle delay (it costs a delayed ACK, ~40 ms).
        // QWebSocket has no socket options of its own; its TCP socket is its child.
        if (auto *tcp = s->findChild<QAbstractSocket *>())
            tcp->setSocketOption(QAbstractSocket::LowDelayOption, 1);
        setState(State::Open);
        emit opened();
    });
    connect(s, &QWebSocket::disconnected, this, [this, s] {
        if (s != socket_)
            return;
        // The server's close code (4001: token expired, contract section 4a).
        closeCode_ = int(s->closeCode());
        onLost();
        closeCode_ = 0;
    });
    if (currentUrl().scheme() == QLatin1String("wss")) {
        // The system's trust store (or the configured CAs) and host name
        // check; TLS 1.2 or later. A certificate error is never ignored.
        QSslConfiguration tls = QSslConfiguration::defaultConfiguration();
        tls.setProtocol(QSsl::TlsV1_2OrLater);
        tls.setPeerVerifyMode(QSslSocket::VerifyPeer);
        if (!trustedCas_.isEmpty())
            tls.setCaCertificates(trustedCas_);
        s->setSslConfiguration(tls);
        connect(s, &QWebSocket::sslErrors, this, [this, s](const QList<QSslError> &errors) {
            if (s != socket_)
                return;
            if (pinnedOnly(s->sslConfiguration().peerCertificate(), errors)) {
                // The pinned certificate itself is the trust: its chain and
                // name need not check out (a self-signed server certificate).
                s->ignoreSslErrors(errors);
                return;
            }
            QStringList why;
            for (const QSslError &e : errors)
                why << e.errorString();
            failTls(why.join(QStringLiteral("; ")));
        });
    }
#if QT_VERSION >= QT_VERSION_CHECK(6, 5, 0)
    constexpr auto socketError = &QWebSocket::errorOccurred; // QWebSocket::error is deprecated from 6.5
#else
    constexpr auto socketError = qOverload<QAbstractSocket::SocketError>(&QWebSocket::error);
#endif
    connect(s, socketError, this, [this, s](QAbstractSocket::SocketError e) {
        if (s != socket_)
            return;
        if (e == QAbstractSocket::SslHandshakeFailedError || e == QAbstractSocket::SslInternalError ||
            e == QAbstractSocket::SslInvalidUserDataError)
            return failTls(s->errorString());
        // Some failures (refused, host not found) report only an error.
        if (s->state() == QAbstractSocket::UnconnectedState)
            onLost();
    });
    connect(s, &QWebSocket::textMessageReceived, this, [this, s](const QString &text) {
        if (s == socket_) {
            emit activity();
            emit textReceived(text.toUtf8());
        }
    });
    connect(s, &QWebSocket::pong, this, [this, s](quint64, const QByteArray &) {
        if (s == socket_)
            emit activity();
    });
    connect(s, &QWebSocket::binaryMessageReceived, this, [this, s](const QByteArray &) {
        // The contract has text frames only; a binary one means a broken peer.
        if (s == socket_)
            s->abort();
    });
    setState(State::Connecting);
    openTimer_.start(openTimeoutMs_);
    s->open(currentUrl());
}

bool Transport::pinnedOnly(const QSslCertificate &peer, const QList<QSslError> &errors) const {
    return pinnedCertificateOnly(pinnedSha256_, peer, errors);
}

void Transport::failTls(const QString &message) {
    if (!running_)
        return;
    // Never ignored, but not final either: a captive portal or a proxy that
    // intercepts TLS gives way, and a server's certificate gets renewed.
    // Reported, then retried with the backoff like any lost attempt.
    emit tlsFailed(QStringLiteral("%1: %2").arg(currentUrl().toString(), message));
    onLost();
}

void Transport::onLost() {
    openTimer_.stop();
    const bool wasOpen = state_ == State::Open;
    dropSocket();
    if (wasOpen)
        emit closed();
    if (!running_) {
        setState(State::Idle);
        return;
    }
    // Rotate through the configured URLs on every lost attempt.
    if (!urls_.isEmpty())
        urlIndex_ = (urlIndex_ + 1) % urls_.size();
    ++failures_;
    scheduleReconnect(-1);
}

void Transport::scheduleReconnect(int delayMs) {
    if (delayMs < 0) {
        // Capped exponential backoff with "equal jitter": [d/2, d].
        const int exp = std::min(failures_ > 0 ? failures_ - 1 : 0, 20);
        const qint64 d = std::min<qint64>(maxMs_, qint64(initialMs_) << exp);
        delayMs = int(d / 2 + QRandomGenerator::global()->bounded(d / 2 + 1));
    }
    nextAttemptAt_ = QDateTime::currentDateTimeUtc().addMSecs(delayMs);
    setState(State::Waiting);
    reconnectTimer_.start(delayMs);
}

void Transport::moveToNextServer(int delayMs) {
    if (!running_)
        return;
    openTimer_.stop();
    const bool wasOpen = state_ == State::Open;
    dropSocket();
    if (wasOpen)
        emit closed();
    if (!urls_.isEmpty())
        urlIndex_ = (urlIndex_ + 1) % urls_.size();
    scheduleReconnect(std::max(0, delayMs));
}

void Transport::onNetworkReachable() {
    if (!running_ || state_ != State::Waiting)
        return;
    qCInfo(lcConnection, "network reachable: reconnecting now instead of after the backoff");
    failures_ = 0;
    attempt();
}

void Transport::onNetworkPathChanged() {
    if (!running_)
        return;
    if (state_ == State::Waiting)
        return onNetworkReachable();
    if (state_ != State::Open && state_ != State::Connecting)
        return;
    qCInfo(lcConnection, "network path changed: reconnecting to %s now", qUtf8Printable(currentUrl().toString()));
    openTimer_.stop();
    const bool wasOpen = state_ == State::Open;
    dropSocket();
    if (wasOpen)
        emit closed();
    failures_ = 0;
    attempt();
}

void Transport::abortNow() {
    if (socket_)
        onLost();
}

QVariant Transport::socketOption(QAbstractSocket::SocketOption option) const {
    if (socket_)
        if (auto *tcp = socket_->findChild<QAbstractSocket *>())
            return tcp->socketOption(option);
    return {};
}

void Transport::ping() {
    if (socket_ && state_ == State::Open)
        socket_->ping();
}

bool Transport::sendText(const QByteArray &frame) {
    if (!socket_ || state_ != State::Open)
        return false;
    if (frame.size() > MaxOutgoingBytes)
        return false; // the server would close the connection (1009): never sent
    return socket_->sendTextMessage(QString::fromUtf8(frame)) >= 0;
}

} // namespace im::detail
