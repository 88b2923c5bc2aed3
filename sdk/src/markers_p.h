// Markers: the delivery (`ack`) and read (`read`) markers this device sends,
// and the confirmed values the server answers with.
//
// Layering: above Connection and Storage; it calls no other part (a
// conversation list refresh it wants, it emits).
#pragma once

#include "codec_p.h"
#include "shared_p.h"
#include "storage_p.h"

#include <QtCore/QHash>
#include <QtCore/QObject>
#include <QtCore/QSet>
#include <QtCore/QString>
#include <QtCore/QTimer>

#include <optional>

namespace im {

class Connection;

class Markers : public QObject {
    Q_OBJECT
public:
    Markers(detail::Storage &storage, Connection &conn, detail::Reporter &reporter);

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

Q_SIGNALS:
    /// Markers of a conversation changed (Client::conversationsChanged).
    void conversationsChanged();
    /// The timeline of `conv` changed (read markers show in it).
    void timelineChanged(const QString &conv);
    /// A read_ok moved the read marker part of the way and the stored rows
    /// cannot count the badge: the server's count is wanted (a walk).
    void convsRefreshWanted();
    /// A reply said EndSession (classify()): the client decides what that means.
    void sessionMustEnd(const std::optional<im::proto::Incoming> &reply);

private:
    void sendRead(const QString &conv, qint64 seq);
    void ackNow(const QString &conv);
    void onAcked(const QString &conv, const std::optional<proto::Incoming> &reply);
    void onRead(const QString &conv, const std::optional<proto::Incoming> &reply);

    detail::Storage &storage_;
    Connection &conn_;
    detail::Reporter &reporter_;
    QHash<QString, qint64> ackSent_; // conv -> highest seq acked on this connection
    QSet<QString> ackDue_;
    QTimer ackTimer_{this};
};

} // namespace im
