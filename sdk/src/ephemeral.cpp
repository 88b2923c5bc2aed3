#include "ephemeral_p.h"

#include "connection_p.h"
#include "logging_p.h"

#include <algorithm>
#include <limits>

namespace im {

namespace {
/// The gateway forwards at most this many typing frames per (device,
/// conversation) in any second (contract 13); the SDK never sends more.
constexpr int TypingFramesPerSecond = 2;
constexpr qint64 Second = 1000;
/// now() truncates to the ms: one more keeps a frame a full second after
/// the answer it counts from.
constexpr qint64 Margin = 1;
} // namespace

Ephemeral::Ephemeral(Connection &conn) : conn_(conn) {
    clock_.start();
    outTimer_.setSingleShot(true);
    expiryTimer_.setSingleShot(true);
    askTimer_.setSingleShot(true);
    askTimer_.setInterval(0); // several watch() calls in one go: one request
    connect(&outTimer_, &QTimer::timeout, this, &Ephemeral::onOutTimer);
    connect(&expiryTimer_, &QTimer::timeout, this, &Ephemeral::onExpiryTimer);
    connect(&askTimer_, &QTimer::timeout, this, &Ephemeral::ask);
}

// ---------------------------------------------------------------------------
// Typing, this user

void Ephemeral::setTyping(const QString &conv, bool typing) {
    if (!conn_.isSessionUp())
        return; // never queued: the next call after the reconnect sends it
    if (typing) {
        Out &o = out_[conv];
        o.idleAt = now() + idleMs;
        if (!o.typing) {
            o.typing = true;
            want(conv);
        }
    } else {
        auto it = out_.find(conv);
        if (it == out_.end() || !it->typing)
            return;
        it->typing = false;
        want(conv);
    }
    armOut();
}

void Ephemeral::messageSent(const QString &conv) { setTyping(conv, false); }

bool Ephemeral::fits(const Out &o) const {
    // The gateway stamped the frame two back before it answered it: a
    // second after the answer is a second after the stamp, however late
    // that frame reached it (a slow network, a slow membership check).
    return o.settled[0] != InFlight && now() - o.settled[0] >= Second + Margin;
}

void Ephemeral::want(const QString &conv) {
    Out &o = out_[conv];
    // The frame two back was stamped by the gateway within the second (or
    // is not answered yet): a third one now could be over its rate and be
    // dropped. It waits; only the latest state goes.
    if (!fits(o)) {
        o.pending = true;
        return;
    }
    o.pending = false;
    if (!o.typing && !o.wireOn)
        return; // on, off and nothing in between went out: nothing to stop
    transmit(conv, o.typing);
}

void Ephemeral::transmit(const QString &conv, bool on) {
    Out &o = out_[conv];
    o.settled[0] = o.settled[1];
    o.frame[0] = o.frame[1];
    o.settled[1] = InFlight;
    const quint64 frame = o.frame[1] = ++lastFrame_;
    static_assert(TypingFramesPerSecond == 2, "Out holds the last two frames");
    o.wireOn = on;
    if (on)
        o.renewAt = now() + renewMs;
    ++typingFramesSent;
    const QString rid = conn_.nextRid();
    // A plain request: forgotten on timeout or loss, never retried (a lost
    // typing frame is harmless, contract 13). Its answer (or loss) starts
    // its second.
    conn_.request(rid, proto::encodeTyping(rid, conv, on), [this, conv, frame](const std::optional<proto::Incoming> &reply) {
        settle(conv, frame);
        if (const QString code = proto::errorCode(reply); !code.isEmpty())
            qCInfo(lcClient, "typing in %s: %s (%s)", qUtf8Printable(conv), qUtf8Printable(code),
                   qUtf8Printable(proto::errorMessage(reply)));
    });
}

void Ephemeral::settle(const QString &conv, quint64 frame) {
    const auto it = out_.find(conv);
    if (it == out_.end())
        return; // the session ended meanwhile
    for (int i = 0; i < 2; ++i)
        if (it->frame[i] == frame)
            it->settled[i] = now();
    armOut();
}

void Ephemeral::onOutTimer() {
    const qint64 t = now();
    const QStringList convs = out_.keys();
    for (const QString &conv : convs) {
        Out &o = out_[conv];
        if (o.typing && t >= o.idleAt) {
            o.typing = false; // no call for idleMs: the user stopped
            want(conv);
        } else if (o.typing && !o.pending && t >= o.renewAt) {
            want(conv);
        } else if (o.pending) {
            want(conv);
        }
        // Forgotten once both frames are a second old: a new entry starts
        // with room for two.
        if (!o.typing && !o.pending && o.settled[0] != InFlight && o.settled[1] != InFlight &&
            t - std::max(o.settled[0], o.settled[1]) >= Second + Margin)
            out_.remove(conv);
    }
    armOut();
}

void Ephemeral::armOut() {
    qint64 next = std::numeric_limits<qint64>::max();
    for (const Out &o : std::as_const(out_)) {
        if (o.typing)
            next = std::min({next, o.idleAt, o.pending ? next : o.renewAt});
        // A frame in flight arms nothing: its answer (or loss) calls again.
        if (o.pending && o.settled[0] != InFlight)
            next = std::min(next, o.settled[0] + Second + Margin);
        if (!o.typing && !o.pending && o.settled[0] != InFlight && o.settled[1] != InFlight)
            next = std::min(next, std::max(o.settled[0], o.settled[1]) + Second + Margin); // forget it then
    }
    if (next == std::numeric_limits<qint64>::max())
        outTimer_.stop();
    else
        outTimer_.start(int(std::clamp<qint64>(next - now(), 0, std::numeric_limits<int>::max())));
}

// ---------------------------------------------------------------------------
// Typing, the others

QStringList Ephemeral::typists(const QString &conv) const {
    QStringList users = typists_.value(conv).keys();
    users.sort();
    return users;
}

void Ephemeral::setTypist(const QString &conv, const QString &user, std::optional<qint64> until) {
    auto &users = typists_[conv];
    const bool had = users.contains(user);
    if (until)
        users.insert(user, *until);
    else
        users.remove(user);
    if (users.isEmpty())
        typists_.remove(conv);
    armExpiry();
    if (had != bool(until))
        emit typingChanged(conv, typists(conv));
}

void Ephemeral::onTypingPush(const proto::TypingPush &push) {
    setTypist(push.conv, push.user, push.on ? std::optional<qint64>(now() + expireMs) : std::nullopt);
}

void Ephemeral::onEvent(const proto::Event &event) {
    // Their message arrived: they are done typing it (the on:false that
    // goes with a send may come after it, or be dropped by the rate limit).
    if (event.kind == u"msg" && typists_.value(event.conv).contains(event.sender))
        setTypist(event.conv, event.sender, std::nullopt);
}

void Ephemeral::onExpiryTimer() {
    const qint64 t = now();
    QList<std::pair<QString, QString>> expired;
    for (auto c = typists_.cbegin(); c != typists_.cend(); ++c)
        for (auto u = c->cbegin(); u != c->cend(); ++u)
            if (u.value() <= t)
                expired.append({c.key(), u.key()});
    for (const auto &[conv, user] : expired)
        setTypist(conv, user, std::nullopt);
    armExpiry();
}

void Ephemeral::armExpiry() {
    qint64 next = std::numeric_limits<qint64>::max();
    for (const auto &users : std::as_const(typists_))
        for (const qint64 until : users)
            next = std::min(next, until);
    if (next == std::numeric_limits<qint64>::max())
        expiryTimer_.stop();
    else
        expiryTimer_.start(int(std::clamp<qint64>(next - now(), 0, std::numeric_limits<int>::max())));
}

// ---------------------------------------------------------------------------
// Presence

void Ephemeral::watch(const QStringList &users) {
    bool added = false;
    for (const QString &u : users) {
        if (u.isEmpty())
            continue;
        if (++watched_[u] == 1)
            added = true;
    }
    if (added)
        scheduleAsk();
}

void Ephemeral::unwatch(const QStringList &users) {
    bool removed = false;
    for (const QString &u : users) {
        auto it = watched_.find(u);
        if (it == watched_.end())
            continue;
        if (--*it <= 0) {
            watched_.erase(it);
            presence_.remove(u);
            removed = true;
        }
    }
    // A smaller list is asked for again so the server stops pushing the
    // others; an empty one cannot be asked (1-500 ids): the pushes of the
    // last users are then ignored.
    if (removed && !watched_.isEmpty())
        scheduleAsk();
}

std::optional<proto::PresenceState> Ephemeral::presence(const QString &user) const {
    const auto it = presence_.constFind(user);
    if (it == presence_.cend())
        return std::nullopt;
    return *it;
}

void Ephemeral::onPresencePush(const proto::PresenceState &state) {
    if (!watched_.contains(state.user))
        return;
    presence_.insert(state.user, state);
    emit presenceChanged({state.user});
}

void Ephemeral::scheduleAsk() {
    if (conn_.isSessionUp() && !askTimer_.isActive())
        askTimer_.start();
}

void Ephemeral::ask() {
    if (!conn_.isSessionUp() || watched_.isEmpty())
        return;
    QStringList users = watched_.keys();
    users.sort();
    if (users.size() > proto::MaxPresenceUsers) {
        qCWarning(lcClient, "%lld users watched: presence asks for the first %d only",
                  static_cast<long long>(users.size()), proto::MaxPresenceUsers);
        users = users.mid(0, proto::MaxPresenceUsers);
    }
    const QString rid = conn_.nextRid();
    conn_.request(rid, proto::encodePresence(rid, users), [this, users](const std::optional<proto::Incoming> &reply) {
        const proto::Disposition disp = proto::classify(reply);
        if (disp == proto::Disposition::Retry) {
            conn_.retryLater(QStringLiteral("presence"), [this] { ask(); });
            return;
        }
        const auto *answer = reply ? std::get_if<proto::PresenceReply>(&reply->body) : nullptr;
        if (disp != proto::Disposition::Success || !answer) {
            qCInfo(lcClient, "presence: %s (%s)", qUtf8Printable(proto::errorCode(reply)),
                   qUtf8Printable(proto::errorMessage(reply)));
            return;
        }
        conn_.retrySucceeded(QStringLiteral("presence"));
        QHash<QString, proto::PresenceState> answered;
        for (const proto::PresenceState &s : answer->users)
            answered.insert(s.user, s);
        for (const QString &u : users) {
            if (!watched_.contains(u))
                continue; // unwatched meanwhile
            const auto it = answered.constFind(u);
            if (it != answered.cend())
                presence_.insert(u, *it);
            else
                presence_.remove(u); // left out: a stranger
        }
        // Every asked user counts as answered (a view may wait for it).
        emit presenceChanged(users);
    });
}

// ---------------------------------------------------------------------------
// Sessions

void Ephemeral::sessionStarted() {
    typingFramesSent = 0;
    if (!watched_.isEmpty())
        scheduleAsk(); // the watch list belongs to the connection: set it again
}

void Ephemeral::sessionEnded() {
    // Our typing is not resent on the next connection (the user's next
    // keystroke starts it again); what we heard is no longer followed.
    out_.clear();
    outTimer_.stop();
    askTimer_.stop();
    const QStringList convs = typists_.keys();
    typists_.clear();
    expiryTimer_.stop();
    for (const QString &conv : convs)
        emit typingChanged(conv, {});
}

void Ephemeral::onResync() {
    // The gateway's bus was lost: presence pushes may have been missed.
    scheduleAsk();
}

} // namespace im
