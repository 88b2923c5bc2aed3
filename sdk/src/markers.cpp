#include "markers_p.h"

#include "client_p.h"

namespace im {

Markers::Markers(ClientPrivate &dd) : d(dd) {
    ackTimer_.setSingleShot(true);
    ackTimer_.setInterval(50);
    QObject::connect(&ackTimer_, &QTimer::timeout, &d, [this] {
        const QSet<QString> due = std::exchange(ackDue_, {});
        for (const QString &conv : due)
            ackNow(conv);
    });
}

void Markers::sendAck(const QString &conv) {
    if (!d.conn.isSessionUp())
        return;
    ackDue_.insert(conv);
    if (!ackTimer_.isActive())
        ackTimer_.start();
}

void Markers::ackNow(const QString &conv) {
    if (!d.conn.isSessionUp())
        return;
    const std::optional<detail::ConvRow> row = d.storage.conversation(conv);
    if (!row || row->after <= 0 || row->after <= row->delivered || row->after <= ackSent_.value(conv, 0))
        return;
    ackSent_.insert(conv, row->after);
    const QString rid = d.conn.nextRid();
    d.conn.request(rid, proto::encodeAck(rid, conv, row->after),
                   [this, conv](const std::optional<proto::Incoming> &reply) { onAcked(conv, reply); });
}

void Markers::onAcked(const QString &conv, const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    if (disp == proto::Disposition::Success) {
        if (const auto *a = std::get_if<proto::Acked>(&reply->body)) {
            if (!d.storage.setDelivered(a->conv, a->delivered))
                d.storageFailed(QStringLiteral("cannot record delivered marker"));
            emit d.conversationsChanged();
        }
    } else if (disp == proto::Disposition::Retry) {
        ackSent_.remove(conv); // the next applied page or push acks again
        d.conn.retryLater(QStringLiteral("ack:") + conv, [this, conv] { ackNow(conv); });
    } else if (disp == proto::Disposition::EndSession) {
        ackSent_.remove(conv);
        d.endSession(reply);
    } else {
        d.reportError(proto::errorCode(reply), proto::errorMessage(reply));
    }
}

bool Markers::markRead(const QString &conv, qint64 seq) {
    if (!d.storage.ensureConversation(conv) || !d.storage.setReadPending(conv, seq)) {
        d.storageFailed(QStringLiteral("cannot record read marker"));
        return false;
    }
    if (d.conn.isSessionUp())
        sendRead(conv, seq);
    return true;
}

void Markers::sendPendingReads() {
    if (!d.conn.isSessionUp())
        return;
    const std::optional<QList<detail::ConvRow>> rows = d.storage.conversations();
    if (!rows) {
        d.storageFailed(QStringLiteral("cannot read conversations"));
        return;
    }
    for (const detail::ConvRow &c : *rows)
        if (c.readPending > c.read)
            sendRead(c.conv, c.readPending);
}

void Markers::sendRead(const QString &conv, qint64 seq) {
    const QString rid = d.conn.nextRid();
    d.conn.request(rid, proto::encodeRead(rid, conv, seq),
                   [this, conv](const std::optional<proto::Incoming> &reply) { onRead(conv, reply); });
}

void Markers::onRead(const QString &conv, const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    if (disp == proto::Disposition::Success) {
        if (const auto *r = std::get_if<proto::ReadOk>(&reply->body)) {
            if (!d.storage.setRead(r->conv, r->read))
                d.storageFailed(QStringLiteral("cannot record read marker"));
            d.conn.retrySucceeded(QStringLiteral("read:") + r->conv);
            emit d.conversationsChanged();
            emit d.timelineChanged(r->conv);
            d.sync.scheduleConvsRefresh();
        }
    } else if (disp == proto::Disposition::Retry) {
        d.conn.retryLater(QStringLiteral("read:") + conv, [this] { sendPendingReads(); });
    } else if (disp == proto::Disposition::EndSession) {
        d.endSession(reply); // the marker stays pending for the next session
    } else {
        if (!d.storage.clearReadPending(conv))
            d.storageFailed(QStringLiteral("cannot clear read marker"));
        d.reportError(proto::errorCode(reply), proto::errorMessage(reply));
    }
}

} // namespace im
