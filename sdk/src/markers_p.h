// Markers: the delivery (`ack`) and read (`read`) markers this device sends,
// and the confirmed values the server answers with.
#pragma once

#include "codec_p.h"

#include <QtCore/QHash>
#include <QtCore/QString>

#include <optional>

namespace im {

class ClientPrivate;

class Markers {
public:
    explicit Markers(ClientPrivate &d) : d(d) {}

    /// Acks the conversation's cursor if it moved past what was acked.
    void sendAck(const QString &conv);
    /// Records a read marker locally and sends it when the session is up.
    bool markRead(const QString &conv, qint64 seq);
    /// Sends every read marker the server has not confirmed yet.
    void sendPendingReads();
    void sessionEnded() { ackSent_.clear(); }

private:
    void sendRead(const QString &conv, qint64 seq);
    void onAcked(const QString &conv, const std::optional<proto::Incoming> &reply);
    void onRead(const QString &conv, const std::optional<proto::Incoming> &reply);

    ClientPrivate &d;
    QHash<QString, qint64> ackSent_; // conv -> highest seq acked on this connection
};

} // namespace im
