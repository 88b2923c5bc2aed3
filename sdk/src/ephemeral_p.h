// Ephemeral: typing and presence (contract section 13, obligation 19).
// Nothing of it is stored or queued: what this device sends goes only on an
// open session (never in the outbox, never resent after a reconnect), and
// what it hears is held in memory with its expiry.
//
// Layering: above Connection (it sends through it and is told of pushes by
// ClientPrivate); it calls no other part. What changed, it emits.
#pragma once

#include "codec_p.h"

#include <QtCore/QElapsedTimer>
#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QStringList>
#include <QtCore/QTimer>

#include <limits>
#include <optional>

namespace im {

class Connection;

class Ephemeral : public QObject {
    Q_OBJECT
public:
    explicit Ephemeral(Connection &conn);

    // --- typing, this user (Client::setTyping) ---------------------------
    /// The user types (true) or stopped (false) in `conv`. The first call
    /// sends `on:true`; while calls keep coming it is renewed every renewMs;
    /// idleMs after the last call, or on false, `on:false` goes. Only on an
    /// open session; at most 2 frames a second per conversation (a frame
    /// over that waits, and only the latest state goes). The second is
    /// counted from the gateway's answer to the frame two back, not from
    /// when it left: the gateway counts frames as they reach it, and a
    /// delayed frame must not make the next one (often the stop) the third
    /// within its second, which it would drop.
    void setTyping(const QString &conv, bool typing);
    /// We sent a message in `conv`: typing there stops (contract 13).
    void messageSent(const QString &conv);
    bool isTyping(const QString &conv) const { return out_.value(conv).typing; }

    // --- typing, the others ------------------------------------------------
    /// Who is typing in `conv` now, sorted.
    QStringList typists(const QString &conv) const;
    void onTypingPush(const proto::TypingPush &push);
    /// A pushed event: a message from a typist ends their typing.
    void onEvent(const proto::Event &event);

    // --- presence ----------------------------------------------------------
    /// Reference-counted watch list (one per PresenceWatch user): the union
    /// is this connection's `presence` watch list, asked again after every
    /// change, every new session and every `resync`.
    void watch(const QStringList &users);
    void unwatch(const QStringList &users);
    /// The last state the server gave for `user`; nullopt if none (not
    /// answered yet, or left out: a stranger).
    std::optional<proto::PresenceState> presence(const QString &user) const;
    void onPresencePush(const proto::PresenceState &state);

    void sessionStarted();
    void sessionEnded();
    void onResync();

    // Timings in ms (contract 13, sdk.md 19); white-box tests shorten them.
    int renewMs = 3000;  ///< on:true again while the user keeps typing
    int idleMs = 5000;   ///< stops by itself after this long without a call
    int expireMs = 6000; ///< a received on:true lasts this long unless renewed
    /// Typing frames sent on this connection (tests: never resent after a reconnect).
    int typingFramesSent = 0;

Q_SIGNALS:
    /// typists(conv) changed.
    void typingChanged(const QString &conv, const QStringList &users);
    /// presence() of these users changed (or was answered).
    void presenceChanged(const QStringList &users);

private:
    struct Out {
        bool typing = false;       ///< what the user does now
        bool wireOn = false;       ///< the last state sent
        bool pending = false;      ///< a frame waits for the rate limit
        qint64 idleAt = 0, renewAt = 0;
        /// The last two frames, oldest first: when the gateway's answer (or
        /// the request's loss) came, InFlight until then, and their ids.
        qint64 settled[2] = {-1000000, -1000000};
        quint64 frame[2] = {0, 0};
    };
    static constexpr qint64 InFlight = std::numeric_limits<qint64>::max();
    /// The next frame fits the gateway's 2 a second.
    bool fits(const Out &o) const;
    void settle(const QString &conv, quint64 frame);
    qint64 now() const { return clock_.elapsed(); }
    void want(const QString &conv);
    void transmit(const QString &conv, bool on);
    void onOutTimer();
    void armOut();
    void onExpiryTimer();
    void armExpiry();
    void setTypist(const QString &conv, const QString &user, std::optional<qint64> until);
    void scheduleAsk();
    void ask();

    Connection &conn_;
    QElapsedTimer clock_;
    QHash<QString, Out> out_;                          // conv -> this user's typing
    quint64 lastFrame_ = 0;                            // ids of typing frames
    QHash<QString, QHash<QString, qint64>> typists_;   // conv -> user -> expires at
    QTimer outTimer_{this};
    QTimer expiryTimer_{this};
    QHash<QString, int> watched_;                      // user -> watchers
    QHash<QString, proto::PresenceState> presence_;    // user -> last state
    QTimer askTimer_{this};
};

} // namespace im
