// Value types and enums shared by the public classes of the SDK.
#pragma once

#include <im/global.h>

#include <QtCore/QDateTime>
#include <QtCore/QMetaType>
#include <QtCore/QObject>
#include <QtCore/QSharedDataPointer>
#include <QtCore/QString>

namespace im {
Q_NAMESPACE_EXPORT(IM_SDK_EXPORT)

/// Where the client is in its connection life cycle.
enum class ConnectionState {
    Disconnected,  ///< not connected and not trying (initial state, after
                   ///< disconnectFromServer(), the QA hook offline, or a terminal
                   ///< hello error such as UNAUTHENTICATED / STALE_INSTALL)
    Connecting,    ///< socket opening or `hello` in flight
    Connected,     ///< `welcome` received; requests flow
    Reconnecting,  ///< connection lost; waiting for the next attempt
                   ///< (see Client::nextReconnectAt)
};
Q_ENUM_NS(ConnectionState)

/// The states a message (or a recall request) goes through in the timeline.
enum class MessageState {
    Pending,   ///< in the durable outbox, not yet confirmed by the server
    Sent,      ///< the server committed it; `seq` is known and permanent
    Failed,    ///< a terminal error (the code is kept); never resent by itself
    Expired,   ///< ORIGINAL_EXPIRED: it was sent once, retention purged it
    Recalled,  ///< a recall event targeting it has been applied
};
Q_ENUM_NS(MessageState)

/// Errors as a type, beside the code string that errorOccurred() carries
/// (the string stays the reference: a code newer than this SDK maps to
/// Unknown). Client::errorReported() gives both.
enum class Error {
    None,                ///< no error
    Unknown,             ///< a code this SDK version does not know (see the code string)
    InvalidArgument,     ///< INVALID_ARGUMENT: a bad call, or a request the server judged invalid
    Unauthenticated,     ///< UNAUTHENTICATED: unknown or revoked token
    NotMember,           ///< NOT_MEMBER: not (or no longer) a member, or no such conversation
    NotFound,            ///< NOT_FOUND: no such event (recall, fetch)
    NotSender,           ///< NOT_SENDER: recall of someone else's message
    AlreadyRecalled,     ///< ALREADY_RECALLED
    RecallWindowExpired, ///< RECALL_WINDOW_EXPIRED
    IdempotencyMismatch, ///< IDEMPOTENCY_MISMATCH: a cmid reused with other content
    OriginalExpired,     ///< ORIGINAL_EXPIRED: sent once, purged by retention
    StaleInstall,        ///< STALE_INSTALL: a newer install of this device exists
    Unavailable,         ///< UNAVAILABLE: transient server trouble (retried by the SDK)
    EpochChanged,        ///< EPOCH_CHANGED: the conversation was rebuilt (handled by the SDK)
    CursorAhead,         ///< CURSOR_AHEAD: the local cursor is past the server's head (handled)
    ProtocolError,       ///< PROTOCOL_ERROR: the server sent something this SDK cannot read
    StorageError,        ///< STORAGE_ERROR: a local database read or write failed
    StoreLocked,         ///< STORE_LOCKED: another process has this store open
    WrongUser,           ///< WRONG_USER: the token belongs to another user than the store; the
                         ///< session is refused for good (no reconnect)
    TlsError,            ///< TLS_ERROR: a wss:// handshake failed (untrusted certificate, wrong
                         ///< name or pin, not TLS at all); retried with the reconnect backoff
    DraftsHeld,          ///< DRAFTS_HELD: at a session start, outbox entries written under another
                         ///< user's credential are held, never sent in this session; the session
                         ///< goes on (obligation 10; Client::heldCount, discardHeldDrafts())
    RateLimited,         ///< RATE_LIMITED: over the sender's rate; the SDK resends after the
                         ///< server's retry_ms with the same cmid (not final)
    Muted,               ///< MUTED: the user is muted in this conversation; final (the message
                         ///< fails, not resent)
    TooLarge,            ///< TOO_LARGE: a file over the size limit (Client::sendFile, the server's
                         ///< --max-attachment-bytes); refused at once, nothing queued
    DigestMismatch,      ///< DIGEST_MISMATCH: a file's bytes do not match its SHA-256. An upload:
                         ///< the store's copy changed since sendFile() (or the server's check
                         ///< failed 4 times), the message fails (messageStateChanged's code,
                         ///< errorReported). A download: the bytes failed the check twice
                         ///< (downloadFailed). A byte damaged on the way is not this: the SDK
                         ///< starts again at 0 by itself (docs/sdk.md "Sending files")
};
Q_ENUM_NS(Error)

/// The typed error for a code string ("NOT_MEMBER" -> Error::NotMember);
/// Error::Unknown for a code this SDK does not know, Error::None for "".
IM_SDK_EXPORT Error errorFromCode(const QString &code);

class OutboxEntryData;

/// One entry of the durable outbox, for introspection (QA panels, badges):
/// what Client::outbox() returns. A read-only value (implicitly shared, cheap
/// to copy); only the SDK fills it. A value class with a private part, so
/// that a later version can tell more about an entry without changing its
/// size or layout (ABI, docs/sdk.md "Versions and ABI"). QML reads the same
/// names as properties (`entry.cmid`, `entry.inFlight`, `entry.held`).
class IM_SDK_EXPORT OutboxEntry {
    Q_GADGET
    Q_PROPERTY(QString cmid READ cmid)
    Q_PROPERTY(QString conv READ conv)
    Q_PROPERTY(QString kind READ kind)
    Q_PROPERTY(QString body READ body)
    Q_PROPERTY(qint64 target READ target)
    Q_PROPERTY(int attempts READ attempts)
    Q_PROPERTY(QString lastError READ lastError)
    Q_PROPERTY(QDateTime nextRetryAt READ nextRetryAt)
    Q_PROPERTY(QDateTime createdAt READ createdAt)
    Q_PROPERTY(bool inFlight READ isInFlight)
    Q_PROPERTY(QString prev READ prev)
    Q_PROPERTY(bool held READ isHeld)
    Q_PROPERTY(qint64 replyTo READ replyTo)
    Q_PROPERTY(QString emoji READ emoji)
    Q_PROPERTY(bool on READ isOn)
    Q_PROPERTY(QString targetCmid READ targetCmid)
public:
    /// An empty entry (no cmid; every number 0, every time invalid).
    OutboxEntry();
    OutboxEntry(const OutboxEntry &other);
    OutboxEntry(OutboxEntry &&other) noexcept;
    OutboxEntry &operator=(const OutboxEntry &other);
    OutboxEntry &operator=(OutboxEntry &&other) noexcept;
    ~OutboxEntry();

    /// The client message id (UUID v4), the request key.
    QString cmid() const;
    /// Conversation id.
    QString conv() const;
    /// "send", "recall", "edit" or "react".
    QString kind() const;
    /// Message text ("send"), the new body ("edit").
    QString body() const;
    /// The seq recalled, edited or reacted to (0 otherwise, and while a
    /// change waits for its target's seq: see targetCmid()).
    qint64 target() const;
    /// How many times it has been put on the wire.
    int attempts() const;
    /// Last retryable failure: "UNAVAILABLE", "TIMEOUT", "DISCONNECTED" (empty: none).
    QString lastError() const;
    /// Earliest next attempt while connected (invalid: as soon as possible).
    QDateTime nextRetryAt() const;
    /// When send()/recall() committed it.
    QDateTime createdAt() const;
    /// A request for it is on the wire, unanswered.
    bool isInFlight() const;
    /// The cmid its latest attempt named as `prev`: the unanswered message of
    /// the same conversation sent just before it, which the server must have
    /// committed before it appends this one. Empty: none (nothing of its
    /// conversation was unanswered then, or it was never put on the wire).
    QString prev() const;
    /// Held (obligation 10, Client::isHeld()): written under a token not
    /// proven to be this store's user; never sent in its sessions.
    bool isHeld() const;
    /// "send": the seq it answers (Client::reply(); 0: not a reply).
    qint64 replyTo() const;
    /// "react": the emoji, and whether it is turned on or off.
    QString emoji() const;
    bool isOn() const;
    /// "edit"/"react" of our own message by cmid, until that message has
    /// its seq (the change waits for it); empty otherwise.
    QString targetCmid() const;

private:
    friend class Outbox; // fills it (sdk/src)
    explicit OutboxEntry(OutboxEntryData *data);
    QSharedDataPointer<OutboxEntryData> d;
};

} // namespace im

Q_DECLARE_METATYPE(im::OutboxEntry)
