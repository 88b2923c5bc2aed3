// Connection: the session with the server. Owns the transport, the `hello`
// handshake and the connection state, the table of requests awaiting a reply
// (their deadlines and timeouts), per-session retries, and the dispatch of
// server-initiated frames (as signals: it knows nothing above it).
//
// Below Outbox, Sync and Markers (they send through it); above the
// transport. What it needs of the client it asks through Host; what it has
// to tell, it emits.
#pragma once

#include <im/types.h>

#include "codec_p.h"
#include "shared_p.h"
#include "transport_p.h"

#include <QtCore/QDateTime>
#include <QtCore/QDeadlineTimer>
#include <QtCore/QElapsedTimer>
#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QTimer>

#include <algorithm>
#include <functional>
#include <optional>

namespace im {

class Connection : public QObject {
    Q_OBJECT
public:
    /// What the connection asks of the client above it (ClientPrivate).
    class Host {
    public:
        /// A connection may be opened: the store is open and not stale.
        virtual bool mayConnect() const = 0;
        /// The install id sent in `hello`.
        virtual QString installId() const = 0;
        /// A `welcome` named this identity: false refuses the session
        /// (another user's store: the host calls refuse()) or could not
        /// record it (a storage error: the connection is dropped and retried).
        virtual bool acceptIdentity(const QString &user, const QString &device) = 0;

    protected:
        ~Host() = default;
    };

    /// Gets the reply of one request, or nullopt for "no reply" (timeout or,
    /// for outbox requests, connection loss).
    using ReplyHandler = std::function<void(const std::optional<proto::Incoming> &reply)>;
    enum class Kind {
        Plain,  ///< forgotten on timeout or loss; a late reply is ignored
        Outbox, ///< told on timeout AND on loss; a late reply is still delivered
    };

    Connection(Host &host, detail::Reporter &reporter, const detail::Backoff &retryBackoff);
    ~Connection() override;

    QString nextRid();
    /// Puts a request on the wire and waits for its reply (requestTimeout).
    /// A failed write leaves it waiting: it times out like a lost reply.
    void request(const QString &rid, const QByteArray &frame, ReplyHandler onReply, Kind kind = Kind::Plain);
    /// Calls `fn` after the backoff of `key`'s next attempt, unless the
    /// session ended meanwhile (a new session redoes everything after hello).
    void retryLater(const QString &key, std::function<void()> fn);
    /// A success resets `key`'s backoff.
    void retrySucceeded(const QString &key) { failures_.remove(key); }

    bool isSessionUp() const { return helloDone_ && state_ == ConnectionState::Connected; }
    /// The session has been up stableSessionMs: the reconnect backoff starts over.
    bool sessionStable() const { return isSessionUp() && !stableTimer_.isActive(); }
    ConnectionState state() const { return state_; }
    QString gateway() const { return gateway_; }

    void start();  ///< connect and keep reconnecting (connectToServer)
    void stop();   ///< disconnect and stay so
    /// QA hooks (im::testing::Faults).
    void setOffline(bool offline);
    bool isOffline() const { return offline_; }
    bool wantsConnection() const { return wantConnected_; }
    void setState(ConnectionState s);
    /// Ends the session for good (no reconnect) and reports `code`.
    void refuse(const QString &code, const QString &message);
    void dropNextReply() { dropNext_ = true; }
    void closeSocketNow() { transport_->abortNow(); }

    detail::Transport *transport() const { return transport_; }
    /// Liveness: a ping every `pingMs` while open; a connection silent for
    /// `silenceMs` (no frame, no pong) is dropped and reconnected.
    void setKeepAlive(int pingMs, int silenceMs);
    int pingIntervalMs() const { return pingMs_; }
    /// The silence timeout in use: as set, but never below the ping interval.
    int silenceTimeoutMs() const { return std::max(pingMs_, silenceMs_); }
    /// The silence timeout as set (setKeepAlive()), before that rule.
    int silenceSettingMs() const { return silenceMs_; }
    /// Delay before reconnecting after a `goaway`: jittered, never 0.
    int goawayDelayMs(std::optional<qint64> retryMs) const;
    /// Server-initiated frames of unknown types seen (and ignored).
    int ignoredFrames() const { return ignoredFrames_; }
    int requestTimeoutMs = 10000;
    /// A session up this long resets the reconnect backoff.
    int stableSessionMs = 30000;
    QList<QUrl> urls;

    // --- credentials (obligation 14, contract section 4a) ---
    QString token() const { return token_; }
    /// A new token from the app: used for the next hello; sent as `refresh`
    /// on an established session when it is a JWT; after a rejection it
    /// ends the wait and reconnects (if the app wants a connection).
    void setToken(const QString &token);
    /// When the token runs out, in local time (invalid if unknown): from the
    /// JWT's `exp`, or the last `token_expiring` / `refreshed`.
    QDateTime tokenExpiresAt() const;
    /// A token was rejected (UNAUTHENTICATED, close 4001): no connection
    /// attempt until setToken().
    bool awaitsCredentials() const { return rejected_; }
    /// How long before the token's expiry the app is asked for a new one
    /// (the server pushes token_expiring 60 s before).
    static constexpr qint64 AskBeforeExpiryMs = 90000;
    /// WebSocket close code of a connection whose token reached `exp`.
    static constexpr int TokenExpiredCloseCode = 4001;

Q_SIGNALS:
    /// state() changed, or (Reconnecting) the next attempt's time moved.
    void stateChanged(im::ConnectionState state);
    /// awaitsCredentials() changed.
    void awaitingCredentialsChanged(bool awaiting);
    /// The app should hand over a token (Client::CredentialsReason as int).
    void credentialsNeeded(int reason);
    /// The server said STALE_INSTALL (on hello, or pushed as an error).
    void staleInstall(const QString &message);
    /// Server-initiated frames (contract section 7) for Sync.
    void eventPushed(const im::proto::Event &event);
    void hintPushed(const im::proto::Hint &hint);
    void resyncPushed();
    /// Contract section 13: typing and presence pushes, for Ephemeral.
    void typingPushed(const im::proto::TypingPush &push);
    void presencePushed(const im::proto::PresenceState &state);
    /// `welcome` accepted: requests flow. `helloToken` is the token the
    /// `hello` carried (the session's, whatever setToken() did meanwhile).
    void sessionStarted(const QString &helloToken);
    /// The connection of an established (or starting) session is gone.
    void sessionEnded();
    /// The QA hook `offline` changed.
    void offlineChanged(bool offline);
    /// QA hook (dropNextReply): the reply to `rid`, of type `type` (its
    /// frame's `t`), was ignored.
    void replyDropped(const QString &rid, const QString &type);
    /// tokenExpiresAt() changed.
    void tokenExpiryChanged();

private:
    struct Waiting {
        ReplyHandler onReply;
        Kind kind = Kind::Plain;
        QDeadlineTimer deadline;
        bool timedOut = false;
    };

    void onOpened();
    void onClosed();
    void onTransportState();
    void onText(const QByteArray &frame);
    void onDeadline();
    void armDeadline();
    void onKeepAlive();
    void onHelloReply(const std::optional<proto::Incoming> &reply);
    void subscribe();
    void onServerFrame(const proto::Incoming &in);
    void sendRefresh();
    /// Records the token's expiry (ms, server clock; 0: unknown) and arms
    /// the timer that asks the app ahead of it.
    void setTokenExpiry(qint64 serverMs);
    void askForCredentials(int reason);
    /// `rejected` was refused: if it is still the current token, wait for
    /// setToken(), no reconnect; if the app handed over another meanwhile,
    /// reconnect with that one.
    void credentialsRejected(const QString &message, const QString &rejected);

    Host &host_;
    detail::Reporter &reporter_;
    const detail::Backoff &backoff_;
    detail::Transport *transport_ = nullptr;
    ConnectionState state_ = ConnectionState::Disconnected;
    QString gateway_;
    bool offline_ = false;
    bool wantConnected_ = false;
    bool helloDone_ = false;
    bool hadSession_ = false;
    bool dropNext_ = false;
    quint64 ridCounter_ = 0;
    quint64 session_ = 0;
    QHash<QString, Waiting> waiting_;  // by rid
    QHash<QString, int> failures_;     // retry key -> failed attempts this session
    QTimer deadlineTimer_{this};    // the earliest request deadline only
    QTimer keepAliveTimer_{this};
    QTimer stableTimer_{this};      // stableSessionMs after welcome: backoff reset
    QElapsedTimer sinceActivity_; // monotonic: last frame or pong
    int pingMs_ = 10000;
    int silenceMs_ = 25000;
    int ignoredFrames_ = 0;
    QString token_;
    QString helloToken_;   // the token the latest hello carried
    QString sessionToken_; // the token the open session runs on (hello, then refreshed)
    bool rejected_ = false;
    qint64 tokenExpMs_ = 0;   // server clock, 0: unknown
    qint64 clockSkewMs_ = 0;  // server clock - local clock, from welcome
    QString expiringAskedFor_; // the token Expiring was already asked about
    QTimer expiryTimer_{this};
};

} // namespace im
