// Value types and enums shared by the public classes of the SDK.
#pragma once

#include <im/global.h>

#include <QtCore/QDateTime>
#include <QtCore/QMetaType>
#include <QtCore/QObject>
#include <QtCore/QString>

namespace im {
Q_NAMESPACE_EXPORT(IM_SDK_EXPORT)

/// Where the client is in its connection life cycle.
enum class ConnectionState {
    Disconnected,  ///< not connected and not trying (initial state, after
                   ///< disconnectFromServer(), setOffline(true), or a terminal
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

/// One entry of the durable outbox, for introspection (QA panels, badges).
struct IM_SDK_EXPORT OutboxEntry {
    Q_GADGET
    Q_PROPERTY(QString cmid MEMBER cmid)
    Q_PROPERTY(QString conv MEMBER conv)
    Q_PROPERTY(QString kind MEMBER kind)
    Q_PROPERTY(QString body MEMBER body)
    Q_PROPERTY(qint64 target MEMBER target)
    Q_PROPERTY(int attempts MEMBER attempts)
    Q_PROPERTY(QString lastError MEMBER lastError)
    Q_PROPERTY(QDateTime nextRetryAt MEMBER nextRetryAt)
    Q_PROPERTY(QDateTime createdAt MEMBER createdAt)
    Q_PROPERTY(bool inFlight MEMBER inFlight)
public:
    QString cmid;          ///< the client message id (UUID v4), the request key
    QString conv;          ///< conversation id
    QString kind;          ///< "send" or "recall"
    QString body;          ///< message text ("send" only)
    qint64 target = 0;     ///< recalled seq ("recall" only)
    int attempts = 0;      ///< how many times it has been put on the wire
    QString lastError;     ///< last retryable failure: "UNAVAILABLE", "TIMEOUT", "DISCONNECTED"
    QDateTime nextRetryAt; ///< earliest next attempt while connected (invalid: as soon as possible)
    QDateTime createdAt;   ///< when send()/recall() committed it
    bool inFlight = false; ///< a request for it is on the wire, unanswered
};

} // namespace im

Q_DECLARE_METATYPE(im::OutboxEntry)
