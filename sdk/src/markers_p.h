// Markers: the delivery (`ack`) and read (`read`) markers this device sends,
// and the confirmed values the server answers with.
#pragma once

#include "codec_p.h"

#include <QtCore/QHash>
#include <QtCore/QSet>
#include <QtCore/QString>
#include <QtCore/QTimer>

#include <optional>

namespace im {

class ClientPrivate;

class Markers {
public:
    explicit Markers(ClientPrivate &d);

    /// Acks the conversation's cursor if it moved past what was acked. Acks
    /// are coalesced over a short interval (a burst of events, one ack).
    void sendAck(const QString &conv);
    /// Records a read marker locally and sends it when the session is up.
    bool markRead(const QString &conv, qint64 seq);
    /// Sends every read marker the server has not confirmed yet.
    void sendPendingReads();
    void sessionEnded() {
        ackSent_.clear();
        ackDue_.clear();
        ackTimer_.stop();
    }

private:
    void sendRead(const QString &conv, qint64 seq);
    void ackNow(const QString &conv);
    void onAcked(const QString &conv, const std::optional<proto::Incoming> &reply);
    void onRead(const QString &conv, const std::optional<proto::Incoming> &reply);

    ClientPrivate &d;
    QHash<QString, qint64> ackSent_; // conv -> highest seq acked on this connection
    QSet<QString> ackDue_;
    QTimer ackTimer_;
};

} // namespace im
