#include "markers_p.h"

#include "connection_p.h"
#include "logging_p.h"

namespace im {

Markers::Markers(detail::Storage &storage, Connection &conn, detail::Reporter &reporter)
    : storage_(storage), conn_(conn), reporter_(reporter) {
    ackTimer_.setSingleShot(true);
    ackTimer_.setInterval(50);
    connect(&ackTimer_, &QTimer::timeout, this, [this] {
        const QSet<QString> due = std::exchange(ackDue_, {});
        for (const QString &conv : due)
            ackNow(conv);
    });
}

void Markers::sendAck(const QString &conv) {
    if (!conn_.isSessionUp())
        return;
    ackDue_.insert(conv);
    if (!ackTimer_.isActive())
        ackTimer_.start();
}

void Markers::ackNow(const QString &conv) {
    if (!conn_.isSessionUp())
        return;
    const std::optional<detail::ConvRow> row = storage_.conversation(conv);
    if (!row || row->after <= 0 || row->after <= row->delivered || row->after <= ackSent_.value(conv, 0))
        return;
    ackSent_.insert(conv, row->after);
    const QString rid = conn_.nextRid();
    conn_.request(rid, proto::encodeAck(rid, conv, row->after),
                   [this, conv](const std::optional<proto::Incoming> &reply) { onAcked(conv, reply); });
}

void Markers::onAcked(const QString &conv, const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    if (disp == proto::Disposition::Success) {
        if (const auto *a = std::get_if<proto::Acked>(&reply->body)) {
            qCDebug(lcMarkers, "%s: delivered up to seq %lld", qUtf8Printable(a->conv), a->delivered);
            if (!storage_.setDelivered(a->conv, a->delivered))
                reporter_.storageFailed(QStringLiteral("cannot record delivered marker"), storage_.lastError());
            emit conversationsChanged();
        }
    } else if (disp == proto::Disposition::Retry) {
        ackSent_.remove(conv); // the next applied page or push acks again
        conn_.retryLater(QStringLiteral("ack:") + conv, [this, conv] { ackNow(conv); });
    } else if (disp == proto::Disposition::EndSession) {
        ackSent_.remove(conv);
        emit sessionMustEnd(reply);
    } else {
        reporter_.report(proto::errorCode(reply), proto::errorMessage(reply));
    }
}

bool Markers::markRead(const QString &conv, qint64 seq) {
    if (!storage_.ensureConversation(conv) || !storage_.setReadPending(conv, seq)) {
        reporter_.storageFailed(QStringLiteral("cannot record read marker"), storage_.lastError());
        return false;
    }
    if (conn_.isSessionUp())
        sendRead(conv, seq);
    return true;
}

void Markers::sendPendingReads() {
    if (!conn_.isSessionUp())
        return;
    const std::optional<QList<detail::ConvRow>> rows = storage_.conversations();
    if (!rows) {
        reporter_.storageFailed(QStringLiteral("cannot read conversations"), storage_.lastError());
        return;
    }
    for (const detail::ConvRow &c : *rows)
        if (c.readPending > c.read)
            sendRead(c.conv, c.readPending);
}

void Markers::sendRead(const QString &conv, qint64 seq) {
    const QString rid = conn_.nextRid();
    conn_.request(rid, proto::encodeRead(rid, conv, seq),
                   [this, conv](const std::optional<proto::Incoming> &reply) { onRead(conv, reply); });
}

void Markers::onRead(const QString &conv, const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    if (disp == proto::Disposition::Success) {
        if (const auto *r = std::get_if<proto::ReadOk>(&reply->body)) {
            qCDebug(lcMarkers, "%s: read up to seq %lld", qUtf8Printable(r->conv), r->read);
            // The badge is counted from the stored rows; only a read the
            // rows cannot count (a gap) needs the server's count (a walk).
            bool uncounted = false;
            if (!storage_.setRead(r->conv, r->read, &uncounted))
                reporter_.storageFailed(QStringLiteral("cannot record read marker"), storage_.lastError());
            conn_.retrySucceeded(QStringLiteral("read:") + r->conv);
            emit conversationsChanged();
            emit timelineChanged(r->conv);
            if (uncounted)
                emit convsRefreshWanted();
        }
    } else if (disp == proto::Disposition::Retry) {
        conn_.retryLater(QStringLiteral("read:") + conv, [this] { sendPendingReads(); });
    } else if (disp == proto::Disposition::EndSession) {
        emit sessionMustEnd(reply); // the marker stays pending for the next session
    } else {
        if (!storage_.clearReadPending(conv))
            reporter_.storageFailed(QStringLiteral("cannot clear read marker"), storage_.lastError());
        reporter_.report(proto::errorCode(reply), proto::errorMessage(reply));
    }
}

} // namespace im
