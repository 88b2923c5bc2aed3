// The wire codec: pure functions between JSON text frames and typed values.
// No sockets, no database, no clock: tested with tables of frames.
#pragma once

#include <QtCore/QByteArray>
#include <QtCore/QList>
#include <QtCore/QString>
#include <QtCore/QStringList>

#include <algorithm>
#include <optional>
#include <variant>

namespace im::proto {

/// One entry of a `msg` event's `reactions` (contract section 12).
struct Reaction {
    QString emoji{};
    qint64 count = 0;
    bool me = false;
    bool operator==(const Reaction &) const = default;
};

/// One entry of a `msg` event's `attachments` (contract section 12,
/// server.md "Attachments"): a complete upload the message references.
struct Attachment {
    QString id{};     ///< att_id
    QString name{};
    QString mime{};
    qint64 size = 0;
    QString sha256{}; ///< 64 lowercase hex digits (the download's ETag)
    bool operator==(const Attachment &) const = default;
};

/// An event as it appears in page.events, fetched.ev and the `event` push.
struct Event {
    QString conv;
    qint64 seq = 0;
    QString mid;
    QString kind;   // msg | recall | join | leave | edit | reaction
    QString sender;
    QString body;   // msg and edit
    qint64 ts = 0;
    qint64 epoch = 0;
    qint64 target = 0; // recall, edit, reaction
    QString user;      // join/leave only
    QString cmid;      // the sender's request key (empty if the server omits it)
    // Contract section 12. msg: what it answers, and its later changes as
    // of the snapshot that read it (0 / empty: none).
    qint64 replyTo = 0;
    qint64 editSeq = 0;  ///< the winning edit's seq (0: never edited)
    QString editBody{};
    qint64 editTs = 0;
    QList<Reaction> reactions{};
    qint64 reactionsSeq = 0;
    bool recalled = false;
    // A user's erase removed its content (docs/protocol.md, "Erased
    // events"); on an operator's recall: its target's content is gone.
    bool erased = false;
    QList<Attachment> attachments{}; ///< msg: its files (contract section 12)
    // reaction events
    QString emoji{};
    bool on = false;
    bool operator==(const Event &) const = default;
};

struct Welcome { QString user, device, gateway; qint64 serverTime = 0; };
struct Sent { QString conv; qint64 seq = 0; QString mid; bool dup = false; qint64 epoch = 0; };
struct Page {
    QString conv;
    QList<Event> events;
    qint64 nextAfter = 0;
    bool hasMore = false;
    qint64 head = 0;
    qint64 minSeq = 1;
    bool trimmed = false;
    qint64 epoch = 0;
    // A `history` window (contract section 6) instead of a sync page: the
    // events are every readable one in [oldest, head] below `before`.
    bool history = false;
    qint64 oldest = 0;
    bool hasOlder = false;
};
struct Acked { QString conv; qint64 delivered = 0; };
struct ReadOk { QString conv; qint64 read = 0; };
struct Recalled { QString conv; qint64 seq = 0; bool dup = false; };
/// Reply to `edit` (contract section 12): the edit event's seq.
struct Edited { QString conv; qint64 seq = 0; bool dup = false; qint64 epoch = 0; };
/// Reply to `react`: `seq` is the event that set the state now (0 when an
/// `on:false` found nothing); `changed` whether this request appended it.
struct Reacted { QString conv; qint64 seq = 0; bool dup = false; bool changed = false; qint64 epoch = 0; };
struct ConvInfo {
    QString conv, kind;
    qint64 head = 0, delivered = 0, read = 0, unread = 0, epoch = 0, minSeq = 1;
    bool operator==(const ConvInfo &) const = default;
};
struct Convs { QList<ConvInfo> convs; QString nextAfter; bool hasMore = false; };
struct Fetched { Event ev; };
struct Subscribed {};
struct EventPush { Event ev; };
struct Hint { QString conv; qint64 head = 0; qint64 epoch = 0; std::optional<qint64> read; };
struct Resync {};
struct Goaway { QString reason; std::optional<qint64> retryMs; };
struct Error {
    QString code, msg;
    /// RATE_LIMITED: the wait before a resend may succeed (contract section 8).
    std::optional<qint64> retryMs;
};
/// Contract section 4a: the connection's token runs out at `exp` (ms since
/// the epoch, server clock) unless refreshed.
struct TokenExpiring { qint64 exp = 0; };
/// Reply to `refresh`: the connection now runs until `exp` (ms, server clock).
struct Refreshed { qint64 exp = 0; };
/// Contract section 13. Reply to `typing`.
struct TypingOk {};
/// Push: another member of `conv` started (`on`) or stopped typing.
struct TypingPush { QString conv, user; bool on = false; };
/// One user's presence: `lastSeen` is ms since the epoch (server clock;
/// 0: never seen online since presence was recorded, the wire's null).
struct PresenceState {
    QString user;
    bool online = false;
    qint64 lastSeen = 0;
    bool operator==(const PresenceState &) const = default;
};
/// Reply to `presence`: the listed users the caller may see (strangers left out).
struct PresenceReply { QList<PresenceState> users; };
/// Push: a watched user's `online` changed.
struct PresencePush { PresenceState state; };
/// A well-formed frame of a type this SDK does not know (forward
/// compatibility: a server-initiated one is ignored).
struct Unknown { QString type; };

using Body = std::variant<Welcome, Sent, Page, Acked, ReadOk, Recalled, Convs, Fetched,
                          Subscribed, EventPush, Hint, Resync, Goaway, Error, TokenExpiring, Refreshed,
                          Unknown, Edited, Reacted, TypingOk, TypingPush, PresenceReply, PresencePush>;

/// A decoded server frame. `rid` is empty for server-initiated frames.
struct Incoming {
    QString rid;
    Body body;
};

/// Decodes one text frame. On failure returns nullopt and sets *error to a
/// human-readable reason; *rid receives the frame's rid when one could be read.
std::optional<Incoming> decode(const QByteArray &frame, QString *error, QString *rid = nullptr);

// Request encoders: each returns one compact JSON text frame.
QByteArray encodeHello(const QString &rid, const QString &token, const QString &install);
/// `prev` (empty: none): the cmid of this sender's previous message in the
/// conversation, which the server requires committed before it appends this
/// one (pipelined sends keep their order; docs/protocol.md, "Send").
/// `replyTo` (0: none): the seq of the message this one answers (contract
/// section 12). `attachments`: complete uploads' att_ids (contract section
/// 12; obligation 17), in the order the fingerprint covers them.
QByteArray encodeSend(const QString &rid, const QString &conv, const QString &cmid, const QString &body,
                      const QString &prev = {}, qint64 replyTo = 0, const QStringList &attachments = {});
/// Contract section 12: a new body for our message `target`.
QByteArray encodeEdit(const QString &rid, const QString &conv, qint64 target, const QString &cmid,
                      const QString &body);
/// Contract section 12: sets our reaction `emoji` on `target` to `on`.
QByteArray encodeReact(const QString &rid, const QString &conv, qint64 target, const QString &cmid,
                       const QString &emoji, bool on);
QByteArray encodeSync(const QString &rid, const QString &conv, qint64 after, int limit,
                      std::optional<qint64> epoch);
QByteArray encodeAck(const QString &rid, const QString &conv, qint64 seq);
QByteArray encodeRead(const QString &rid, const QString &conv, qint64 seq);
QByteArray encodeRecall(const QString &rid, const QString &conv, qint64 target, const QString &cmid);
/// `after` empty: from the start; `limit` <= 0: the server's default.
QByteArray encodeConvs(const QString &rid, const QString &after = {}, int limit = 0);
/// `before` 0: the newest window.
QByteArray encodeHistory(const QString &rid, const QString &conv, qint64 before, int limit,
                         std::optional<qint64> epoch);
QByteArray encodeFetch(const QString &rid, const QString &conv, qint64 seq);
QByteArray encodeSub(const QString &rid);
/// Contract section 13: this user is (`on`) or stopped being typing in `conv`.
QByteArray encodeTyping(const QString &rid, const QString &conv, bool on);
/// Contract section 13: the presence of `users` (1-500 ids), and this
/// connection's watch list.
QByteArray encodePresence(const QString &rid, const QStringList &users);
/// At most this many users in one `presence` request.
inline constexpr int MaxPresenceUsers = 500;
/// Contract section 4a: swaps the open connection's token for `token` (a JWT).
QByteArray encodeRefresh(const QString &rid, const QString &token);

/// True if `token` has the shape of a compact JWS (three base64url parts).
bool isJwt(const QString &token);
/// The `exp` claim of a JWT in ms since the epoch, read without checking the
/// signature (only the server can; this is for asking the app early). Null if
/// `token` is not a JWT or carries no numeric `exp`.
std::optional<qint64> jwtExpiryMs(const QString &token);

/// Contract limits (section 9) the client checks before queueing anything.
inline constexpr int MaxBodyCodePoints = 4000;
inline constexpr qsizetype MaxFrameBytes = 64 * 1024;
/// Empty if the server would accept a `send` of `body` to `conv`; else why not.
QString checkSend(const QString &conv, const QString &body);
/// Empty if the server would accept `emoji` in a `react` (1-64 bytes of
/// UTF-8, no control characters); else why not.
QString checkEmoji(const QString &emoji);
/// At most this many distinct emoji of one user on one message.
inline constexpr int MaxEmojiPerUser = 20;
/// Empty if `conv` is a valid conversation id ([A-Za-z0-9._:-]{1,64}).
QString checkConv(const QString &conv);

/// What a caller does with the outcome of one request (contract section 1).
enum class Disposition {
    Success,   ///< took effect: drop from the outbox, record the ids
    Terminal,  ///< never will take effect: drop from the outbox, tell the user
    Retry,     ///< unknown or not applied: keep, resend later with the same key
    /// Not a verdict on the request: the session itself may not go on
    /// (UNAUTHENTICATED: the token is no longer accepted; STALE_INSTALL: the
    /// install is superseded). Keep the entry, end the session; the entry
    /// goes once a session is accepted again.
    EndSession,
};

/// THE classification function, and the only place in the SDK that knows
/// which error codes are retryable. `reply` is the reply frame for a request,
/// or nullopt when there was no reply (timeout, socket closed).
Disposition classify(const std::optional<Incoming> &reply);

/// The error code / message of a reply (empty unless it is an `error`).
inline QString errorCode(const std::optional<Incoming> &reply) {
    if (reply)
        if (const auto *e = std::get_if<Error>(&reply->body))
            return e->code;
    return {};
}
/// RATE_LIMITED's retry_ms (0 for any other reply, or one without it).
inline qint64 retryAfterMs(const std::optional<Incoming> &reply) {
    if (reply)
        if (const auto *e = std::get_if<Error>(&reply->body))
            if (e->code == u"RATE_LIMITED" && e->retryMs && *e->retryMs > 0)
                return std::min<qint64>(*e->retryMs, 600000);
    return 0;
}
inline QString errorMessage(const std::optional<Incoming> &reply) {
    if (reply)
        if (const auto *e = std::get_if<Error>(&reply->body))
            return e->msg;
    return {};
}

/// Well-known error code strings (contract section 8).
namespace code {
inline constexpr char16_t OriginalExpired[] = u"ORIGINAL_EXPIRED";
inline constexpr char16_t EpochChanged[] = u"EPOCH_CHANGED";
inline constexpr char16_t CursorAhead[] = u"CURSOR_AHEAD";
inline constexpr char16_t StaleInstall[] = u"STALE_INSTALL";
inline constexpr char16_t Unauthenticated[] = u"UNAUTHENTICATED";
inline constexpr char16_t RateLimited[] = u"RATE_LIMITED";
inline constexpr char16_t Muted[] = u"MUTED";
} // namespace code

} // namespace im::proto
