#include "connection_p.h"

#include "logging_p.h"

#include <im/client.h>

#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QRandomGenerator>

#include <algorithm>

namespace im {

Connection::Connection(Host &host, detail::Reporter &reporter, const detail::Backoff &retryBackoff)
    : host_(host), reporter_(reporter), backoff_(retryBackoff) {
    transport_ = new detail::Transport(this);
    connect(transport_, &detail::Transport::opened, this, &Connection::onOpened);
    connect(transport_, &detail::Transport::closed, this, &Connection::onClosed);
    connect(transport_, &detail::Transport::textReceived, this, &Connection::onText);
    connect(transport_, &detail::Transport::stateChanged, this, &Connection::onTransportState);
    connect(transport_, &detail::Transport::tlsFailed, this, [this](const QString &message) {
        // Never ignored, and reported on every attempt (lastError keeps it
        // while the state reads Reconnecting); the transport tries again
        // after its backoff: a captive portal's certificate goes away.
        reporter_.fail(QStringLiteral("TLS_ERROR"), QStringLiteral("TLS_ERROR: %1").arg(message), message);
    });
    stableTimer_.setSingleShot(true);
    connect(&stableTimer_, &QTimer::timeout, this, [this] { transport_->resetBackoff(); });
    connect(transport_, &detail::Transport::activity, this, [this] { sinceActivity_.start(); });
    deadlineTimer_.setSingleShot(true);
    connect(&deadlineTimer_, &QTimer::timeout, this, &Connection::onDeadline);
    connect(&keepAliveTimer_, &QTimer::timeout, this, &Connection::onKeepAlive);
    expiryTimer_.setSingleShot(true);
    connect(&expiryTimer_, &QTimer::timeout, this, [this] { setTokenExpiry(tokenExpMs_); });
}

void Connection::setKeepAlive(int pingMs, int silenceMs) {
    pingMs_ = std::max(1, pingMs);
    silenceMs_ = std::max(1, silenceMs); // used as at least pingMs_ (silenceTimeoutMs())
    if (keepAliveTimer_.isActive())
        keepAliveTimer_.start(pingMs_);
}

void Connection::onKeepAlive() {
    if (sinceActivity_.isValid() && sinceActivity_.hasExpired(silenceTimeoutMs())) {
        // Nothing came back (not even a pong): the socket is dead (suspend,
        // network change, a peer gone without FIN). Reconnect.
        qCInfo(lcConnection, "nothing heard for %d ms: dropping the connection", silenceTimeoutMs());
        transport_->abortNow();
        return;
    }
    transport_->ping();
}

Connection::~Connection() { transport_->disconnect(this); }

int Connection::goawayDelayMs(std::optional<qint64> retryMs) const {
    // Every client of a draining gateway gets its goaway at the same moment:
    // spread their reconnects over [base, 2 * base] so they do not arrive at
    // the next gateway together. base: the server's retry_ms, else our own
    // first reconnect backoff (never 0 ms).
    const qint64 base = std::clamp<qint64>(retryMs.value_or(transport_->initialBackoffMs()), 1, 10 * 60 * 1000);
    return int(base + QRandomGenerator::global()->bounded(base + 1));
}

QString Connection::nextRid() { return QStringLiteral("r%1").arg(++ridCounter_); }

void Connection::setState(ConnectionState s) {
    if (s == state_)
        return;
    state_ = s;
    if (s != ConnectionState::Connected)
        gateway_.clear();
    emit stateChanged(s);
}

void Connection::start() {
    wantConnected_ = true;
    if (rejected_) {
        // Not again with a token the server refused: ask, and wait.
        qCInfo(lcConnection, "not connecting: the token was rejected, waiting for setCredentials()");
        askForCredentials(int(Client::CredentialsReason::Rejected));
        return;
    }
    if (offline_ || transport_->isRunning())
        return;
    hadSession_ = false;
    transport_->start();
}

void Connection::stop() {
    wantConnected_ = false;
    transport_->stop();
    setState(ConnectionState::Disconnected);
}

void Connection::setOffline(bool offline) {
    if (offline == offline_)
        return;
    offline_ = offline;
    if (offline) {
        transport_->stop();
        setState(ConnectionState::Disconnected);
    } else if (wantConnected_ && !rejected_ && host_.mayConnect()) {
        hadSession_ = false;
        transport_->start();
    }
    emit offlineChanged(offline);
}

void Connection::request(const QString &rid, const QByteArray &frame, ReplyHandler onReply, Kind kind) {
    Waiting w;
    w.onReply = std::move(onReply);
    w.kind = kind;
    w.deadline = QDeadlineTimer(requestTimeoutMs);
    waiting_.insert(rid, std::move(w));
    if (!deadlineTimer_.isActive() || deadlineTimer_.remainingTime() > requestTimeoutMs)
        deadlineTimer_.start(requestTimeoutMs);
    transport_->sendText(frame);
}

void Connection::retryLater(const QString &key, std::function<void()> fn) {
    const int attempt = ++failures_[key];
    const quint64 s = session_;
    QTimer::singleShot(backoff_.delayMs(attempt), this, [this, s, fn = std::move(fn)] {
        if (s == session_ && isSessionUp())
            fn();
    });
}

void Connection::onTransportState() {
    using TS = detail::Transport::State;
    switch (transport_->state()) {
    case TS::Idle:
        setState(ConnectionState::Disconnected);
        break;
    case TS::Connecting:
    case TS::Open:
        if (!helloDone_)
            setState(hadSession_ ? ConnectionState::Reconnecting : ConnectionState::Connecting);
        break;
    case TS::Waiting:
        setState(ConnectionState::Reconnecting);
        emit stateChanged(state_); // nextReconnectAt moved
        break;
    }
}

void Connection::onOpened() {
    qCDebug(lcConnection, "socket open to %s, sending hello", qUtf8Printable(transport_->currentUrl().toString()));
    helloDone_ = false;
    ++session_;
    waiting_.clear();
    sinceActivity_.start();
    keepAliveTimer_.start(pingMs_);
    const QString rid = nextRid();
    helloToken_ = token_; // the session this hello opens is this token's (obligation 10)
    request(rid, proto::encodeHello(rid, token_, host_.installId()),
            [this](const std::optional<proto::Incoming> &reply) { onHelloReply(reply); });
}

void Connection::onClosed() {
    const bool hadHello = helloDone_;
    qCInfo(lcConnection, "connection closed (%lld requests unanswered)", static_cast<long long>(waiting_.size()));
    helloDone_ = false;
    ++session_;
    // Every request on the wire is now "no reply": outbox entries stay and
    // are resent after the next hello; everything else is redone then too.
    const auto old = waiting_;
    waiting_.clear();
    for (const Waiting &w : old)
        if (w.kind == Kind::Outbox && !w.timedOut)
            w.onReply(std::nullopt);
    failures_.clear();
    deadlineTimer_.stop();
    keepAliveTimer_.stop();
    stableTimer_.stop();
    emit sessionEnded();
    if (hadHello)
        hadSession_ = true;
    if (transport_->lastCloseCode() == TokenExpiredCloseCode)
        credentialsRejected(QStringLiteral("the server closed the connection: token expired (close code 4001)"),
                            sessionToken_);
}

void Connection::onDeadline() {
    QList<QString> expired;
    for (auto it = waiting_.cbegin(); it != waiting_.cend(); ++it)
        if (!it->timedOut && it->deadline.hasExpired())
            expired.append(it.key());
    for (const QString &rid : expired) {
        auto it = waiting_.find(rid);
        if (it == waiting_.end())
            continue;
        const ReplyHandler handler = it->onReply;
        if (it->kind == Kind::Outbox)
            it->timedOut = true; // keep it: a late success still finalizes the entry
        else
            waiting_.erase(it);
        handler(std::nullopt);
    }
    armDeadline();
}

void Connection::armDeadline() {
    qint64 next = -1;
    for (const Waiting &w : std::as_const(waiting_))
        if (!w.timedOut && (next < 0 || w.deadline.remainingTime() < next))
            next = std::max<qint64>(0, w.deadline.remainingTime());
    if (next < 0)
        deadlineTimer_.stop();
    else
        deadlineTimer_.start(int(next));
}

void Connection::onText(const QByteArray &frame) {
    QString err, rid;
    std::optional<proto::Incoming> in = proto::decode(frame, &err, &rid);
    if (!in) {
        // A malformed reply is treated as no reply (its request times out).
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), err);
        return;
    }
    if (in->rid.isEmpty()) {
        onServerFrame(*in);
        return;
    }
    auto it = waiting_.find(in->rid);
    if (it == waiting_.end())
        return; // late reply to a request already given up (not an outbox one)
    if (dropNext_) { // QA hook
        dropNext_ = false;
        emit replyDropped(in->rid, QJsonDocument::fromJson(frame).object().value(QLatin1String("t")).toString());
        return;
    }
    const Waiting w = *it;
    waiting_.erase(it);
    // STALE_INSTALL is a verdict on the install, not on the request; the
    // outbox handles it itself (it keeps the entry).
    if (w.kind == Kind::Plain && !w.timedOut && proto::errorCode(in) == proto::code::StaleInstall
        && proto::classify(in) == proto::Disposition::EndSession && helloDone_) {
        emit staleInstall(proto::errorMessage(in));
        return;
    }
    w.onReply(in);
}

void Connection::onServerFrame(const proto::Incoming &in) {
    // Server-initiated frames (contract section 7).
    std::visit(
        [this](const auto &b) {
            using T = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<T, proto::EventPush>) {
                emit eventPushed(b.ev);
            } else if constexpr (std::is_same_v<T, proto::Hint>) {
                emit hintPushed(b);
            } else if constexpr (std::is_same_v<T, proto::Resync>) {
                emit resyncPushed();
            } else if constexpr (std::is_same_v<T, proto::TypingPush>) {
                emit typingPushed(b);
            } else if constexpr (std::is_same_v<T, proto::PresencePush>) {
                emit presencePushed(b.state);
            } else if constexpr (std::is_same_v<T, proto::Goaway>) {
                transport_->moveToNextServer(goawayDelayMs(b.retryMs));
            } else if constexpr (std::is_same_v<T, proto::TokenExpiring>) {
                qCInfo(lcConnection, "token_expiring: the token runs out in %lld ms (server clock)",
                       static_cast<long long>(b.exp - (QDateTime::currentMSecsSinceEpoch() + clockSkewMs_)));
                const QString current = token_;
                setTokenExpiry(b.exp); // may ask already (less than 90 s left)
                if (token_ == current) // else the app handed over a new one meanwhile
                    askForCredentials(int(Client::CredentialsReason::Expiring));
            } else if constexpr (std::is_same_v<T, proto::Error>) {
                if (b.code == proto::code::StaleInstall)
                    emit staleInstall(b.msg);
                else
                    reporter_.report(b.code, b.msg);
            } else if constexpr (std::is_same_v<T, proto::Unknown>) {
                // A newer server's frame type: ignored (forward compatibility).
                ++ignoredFrames_;
            }
        },
        in.body);
}

void Connection::onHelloReply(const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    const QString code = proto::errorCode(reply);
    if (disp == proto::Disposition::Success) {
        const auto *w = std::get_if<proto::Welcome>(&reply->body);
        if (!w) {
            reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("hello answered without welcome"));
            transport_->abortNow();
            return;
        }
        if (w->serverTime > 0) {
            clockSkewMs_ = w->serverTime - QDateTime::currentMSecsSinceEpoch();
            setTokenExpiry(tokenExpMs_);
        }
        if (!host_.acceptIdentity(w->user, w->device)) {
            if (wantConnected_)
                transport_->abortNow(); // a storage error: try again
            return;
        }
        gateway_ = w->gateway;
        helloDone_ = true;
        sessionToken_ = helloToken_;
        qCInfo(lcConnection, "welcome: user %s, device %s, gateway %s", qUtf8Printable(w->user),
               qUtf8Printable(w->device), qUtf8Printable(w->gateway));
        // The reconnect backoff starts over only once this session has
        // stayed up a while: a gateway that drops every session right after
        // its welcome is not hammered at the first backoff step.
        stableTimer_.start(stableSessionMs);
        state_ = ConnectionState::Reconnecting; // force the emission below
        setState(ConnectionState::Connected);
        subscribe();
        emit sessionStarted(helloToken_);
        if (token_ != helloToken_ && isSessionUp()) {
            // Handed over during the handshake: the session runs on the
            // token the hello carried; the new one is sent as `refresh` (a
            // JWT) or used for the next hello.
            qCInfo(lcConnection, "a new token was handed over during the handshake");
            sendRefresh();
        }
    } else if (code == proto::code::StaleInstall) {
        emit staleInstall(proto::errorMessage(reply));
    } else if (code == proto::code::Unauthenticated) {
        credentialsRejected(proto::errorMessage(reply), helloToken_);
    } else if (disp == proto::Disposition::Retry) {
        transport_->abortNow(); // reconnect with backoff
    } else {
        reporter_.lastError = QStringLiteral("%1: %2").arg(code, proto::errorMessage(reply));
        refuse(code, proto::errorMessage(reply));
    }
}

void Connection::refuse(const QString &code, const QString &message) {
    qCInfo(lcConnection, "session refused for good (%s): no reconnect", qUtf8Printable(code));
    wantConnected_ = false;
    transport_->stop();
    setState(ConnectionState::Disconnected);
    reporter_.report(code, message);
}

void Connection::subscribe() {
    const QString rid = nextRid();
    request(rid, proto::encodeSub(rid), [this](const std::optional<proto::Incoming> &reply) {
        const proto::Disposition disp = proto::classify(reply);
        if (disp == proto::Disposition::Retry)
            retryLater(QStringLiteral("sub"), [this] { subscribe(); });
        else if (disp != proto::Disposition::Success)
            reporter_.report(proto::errorCode(reply), proto::errorMessage(reply));
    });
}

} // namespace im

namespace im {

// ---------------------------------------------------------------------------
// Credentials (obligation 14, contract section 4a)

void Connection::setToken(const QString &token) {
    token_ = token;
    expiringAskedFor_.clear();
    setTokenExpiry(proto::jwtExpiryMs(token).value_or(0));
    if (rejected_) {
        rejected_ = false;
        qCInfo(lcConnection, "new credentials after a rejection");
        emit awaitingCredentialsChanged(false);
        if (wantConnected_ && !offline_ && host_.mayConnect() && !transport_->isRunning()) {
            hadSession_ = false;
            transport_->start();
        }
        return;
    }
    if (isSessionUp())
        sendRefresh();
}

void Connection::sendRefresh() {
    if (!proto::isJwt(token_)) {
        // Only a JWT can be refreshed (section 4a); a random device token is
        // simply used for the next hello.
        qCInfo(lcConnection, "new token is not a JWT: kept for the next hello, no refresh");
        return;
    }
    const QString rid = nextRid();
    const QString sentToken = token_;
    qCInfo(lcConnection, "sending refresh with the new token");
    request(rid, proto::encodeRefresh(rid, sentToken), [this, sentToken](const std::optional<proto::Incoming> &reply) {
        if (sentToken != token_)
            return; // superseded by a newer token (its own refresh is on the way)
        const proto::Disposition disp = proto::classify(reply);
        if (disp == proto::Disposition::Success) {
            if (const auto *r = std::get_if<proto::Refreshed>(&reply->body)) {
                qCInfo(lcConnection, "refreshed: the connection runs on the new token");
                sessionToken_ = sentToken;
                setTokenExpiry(r->exp);
            }
            retrySucceeded(QStringLiteral("refresh"));
        } else if (disp == proto::Disposition::Retry) {
            retryLater(QStringLiteral("refresh"), [this] { sendRefresh(); });
        } else if (proto::errorCode(reply) == proto::code::Unauthenticated) {
            credentialsRejected(proto::errorMessage(reply), sentToken);
        } else {
            // A server without JWT support: the token waits for the next hello.
            qCWarning(lcConnection, "refresh refused (%s): the new token is used from the next hello",
                      qUtf8Printable(proto::errorCode(reply)));
        }
    });
}

QDateTime Connection::tokenExpiresAt() const {
    if (tokenExpMs_ <= 0)
        return {};
    return QDateTime::fromMSecsSinceEpoch(tokenExpMs_ - clockSkewMs_, Qt::UTC);
}

void Connection::setTokenExpiry(qint64 serverMs) {
    const bool changed = serverMs != tokenExpMs_;
    tokenExpMs_ = serverMs;
    expiryTimer_.stop();
    if (tokenExpMs_ > 0) {
        // The wall clock only places the deadline; the wait is a (monotonic) timer.
        const qint64 left = tokenExpMs_ - clockSkewMs_ - QDateTime::currentMSecsSinceEpoch();
        const qint64 untilAsk = left - AskBeforeExpiryMs;
        if (untilAsk <= 0)
            askForCredentials(int(Client::CredentialsReason::Expiring));
        else
            expiryTimer_.start(int(std::min<qint64>(untilAsk, 3600 * 1000))); // re-checked after an hour
    }
    if (changed)
        emit tokenExpiryChanged();
}

void Connection::askForCredentials(int reason) {
    const auto r = Client::CredentialsReason(reason);
    if (r == Client::CredentialsReason::Expiring) {
        if (expiringAskedFor_ == token_ || rejected_)
            return; // asked once per token
        expiringAskedFor_ = token_;
        qCInfo(lcConnection, "asking the app for a new token: the current one expires soon");
    } else {
        qCInfo(lcConnection, "asking the app for a new token: the current one was rejected");
    }
    emit credentialsNeeded(reason);
}

void Connection::credentialsRejected(const QString &message, const QString &rejected) {
    if (rejected != token_) {
        // The app handed over another token meanwhile (during the
        // handshake, or before the expired one was refreshed): that one is
        // not judged yet. Reconnect with it, nothing is carried.
        qCInfo(lcConnection, "the previous token was rejected (%s); reconnecting with the newer one",
               qUtf8Printable(message));
        if (wantConnected_)
            transport_->abortNow();
        return;
    }
    const bool was = rejected_;
    rejected_ = true;
    reporter_.lastError = QStringLiteral("UNAUTHENTICATED: %1").arg(message);
    qCInfo(lcConnection, "token rejected (%s): waiting for new credentials, no reconnect", qUtf8Printable(message));
    transport_->stop();
    setState(ConnectionState::Disconnected);
    if (was)
        return;
    emit awaitingCredentialsChanged(true);
    reporter_.report(QString::fromUtf16(proto::code::Unauthenticated), message);
    askForCredentials(int(Client::CredentialsReason::Rejected));
}

} // namespace im
