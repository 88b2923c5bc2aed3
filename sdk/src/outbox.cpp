#include "outbox_p.h"

#include "client_p.h"

#include <QtCore/QDateTime>
#include <QtCore/QUuid>

namespace im {
namespace {

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

} // namespace

Outbox::Outbox(ClientPrivate &dd) : d(dd) {}

void Outbox::load(const QList<detail::OutboxRow> &rows) {
    for (const detail::OutboxRow &r : rows) {
        items_.emplace(r.id, Item{r, false, {}});
        ids_.insert(r.cmid, r.id);
    }
}

void Outbox::clear() {
    items_.clear();
    ids_.clear();
    inFlight_ = 0;
}

QString Outbox::enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target) {
    if (!d.storage.isOpen()) {
        d.lastError = QStringLiteral("database not open");
        emit d.q->errorOccurred(QStringLiteral("INVALID_ARGUMENT"), d.lastError);
        return {};
    }
    detail::OutboxRow row;
    row.cmid = QUuid::createUuid().toString(QUuid::WithoutBraces); // UUID v4, random (A1)
    row.kind = kind;
    row.conv = conv;
    row.body = body;
    row.target = target;
    row.createdAt = nowMs();
    // A2: committed (WAL, synchronous=FULL) before anything is transmitted.
    row.id = d.storage.enqueue(row);
    if (row.id == 0) {
        d.storageFailed(QStringLiteral("cannot write outbox"));
        return {};
    }
    items_.emplace(row.id, Item{row, false, {}});
    ids_.insert(row.cmid, row.id);
    emit d.q->messageStateChanged(conv, row.cmid, 0, MessageState::Pending, QString());
    emit d.q->outboxChanged();
    emit d.timelineChanged(conv);
    schedulePump();
    return row.cmid;
}

void Outbox::resendPending() {
    for (auto &[id, item] : items_)
        if (!item.inFlight)
            item.row.nextRetryAt = 0;
    pump();
}

void Outbox::schedulePump() {
    if (pumpQueued_)
        return;
    pumpQueued_ = true;
    QMetaObject::invokeMethod(this, [this] {
        pumpQueued_ = false;
        pump();
    }, Qt::QueuedConnection);
}

void Outbox::pump() {
    if (!d.conn.isSessionUp() || d.stale)
        return;
    const qint64 now = nowMs();
    bool sent = false;
    for (auto &[id, item] : items_) {
        if (inFlight_ >= window)
            break;
        if (item.inFlight || item.row.nextRetryAt > now)
            continue;
        const QString rid = d.conn.nextRid();
        const QByteArray frame = item.row.kind == u"recall"
                                     ? proto::encodeRecall(rid, item.row.conv, item.row.target, item.row.cmid)
                                     : proto::encodeSend(rid, item.row.conv, item.row.cmid, item.row.body);
        ++item.row.attempts;
        item.inFlight = true;
        item.rid = rid;
        ++inFlight_;
        sent = true;
        const QString cmid = item.row.cmid;
        d.conn.request(
            rid, frame,
            [this, rid, cmid](const std::optional<proto::Incoming> &reply) { onOutcome(rid, cmid, reply); },
            Connection::Kind::Outbox);
    }
    if (sent)
        emit d.q->outboxChanged();
}

void Outbox::onOutcome(const QString &rid, const QString &cmid, const std::optional<proto::Incoming> &reply) {
    const auto idIt = ids_.constFind(cmid);
    if (idIt == ids_.cend())
        return; // already final (e.g. a late duplicate reply)
    const qint64 id = *idIt;
    Item &item = items_.at(id);
    const bool current = item.inFlight && item.rid == rid;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = proto::errorCode(reply);

    if (disp == proto::Disposition::Retry) {
        if (!current)
            return; // an older attempt; a newer one is on the wire
        item.inFlight = false;
        --inFlight_;
        item.row.lastError = !code.isEmpty()            ? code
                             : d.conn.isSessionUp() ? QStringLiteral("TIMEOUT")
                                                        : QStringLiteral("DISCONNECTED");
        item.row.nextRetryAt = nowMs() + d.backoffMs(item.row.attempts);
        if (!d.storage.recordRetry(cmid, item.row.attempts, item.row.lastError, item.row.nextRetryAt))
            d.storageFailed(QStringLiteral("cannot record retry"));
        emit d.q->outboxChanged();
        return;
    }
    if (code == proto::code::StaleInstall) {
        // Not a verdict on the message: the install is stale. Keep the entry
        // (resetInstall() keeps the outbox) and stop.
        if (current) {
            item.inFlight = false;
            --inFlight_;
        }
        d.enterStale(proto::errorMessage(reply));
        return;
    }

    MessageState finalState = MessageState::Sent;
    qint64 seq = 0, epoch = 0;
    bool dup = false;
    if (disp == proto::Disposition::Success) {
        if (const auto *s = std::get_if<proto::Sent>(&reply->body)) {
            seq = s->seq;
            dup = s->dup;
            epoch = s->epoch;
        } else if (const auto *r = std::get_if<proto::Recalled>(&reply->body)) {
            seq = r->seq;
            dup = r->dup;
        } else {
            // A success frame of the wrong type: treat as no reply.
            emit d.q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("unexpected reply to send/recall"));
            if (current) {
                item.inFlight = false;
                --inFlight_;
                item.row.nextRetryAt = nowMs() + d.backoffMs(item.row.attempts);
            }
            return;
        }
    } else {
        // A4: ORIGINAL_EXPIRED means "sent once, purged": Expired, never resent.
        finalState = code == proto::code::OriginalExpired ? MessageState::Expired : MessageState::Failed;
    }
    if (!d.storage.finishOutbox(cmid, int(finalState), disp == proto::Disposition::Terminal ? code : QString(), seq,
                                dup, epoch)) {
        // Keep the entry: a resend gets the same answer (dup) and we try again.
        d.storageFailed(QStringLiteral("cannot finish outbox entry"));
        if (current) {
            item.inFlight = false;
            --inFlight_;
            item.row.nextRetryAt = nowMs() + d.backoffMs(item.row.attempts);
        }
        return;
    }
    if (item.inFlight)
        --inFlight_;
    const QString conv = item.row.conv;
    items_.erase(id);
    ids_.remove(cmid);
    emit d.q->messageStateChanged(conv, cmid, seq, finalState,
                                  disp == proto::Disposition::Terminal ? code : QString());
    emit d.q->outboxChanged();
    emit d.timelineChanged(conv);
    schedulePump();
}

void Outbox::settleOwnEvents(const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.cmid.isEmpty() || e.sender != d.userId || !ids_.contains(e.cmid))
            continue;
        // The committed event is the answer: seq and mid are permanent.
        proto::Incoming settled;
        if (e.kind == u"recall")
            settled.body = proto::Recalled{e.conv, e.seq, false};
        else if (e.kind == u"msg")
            settled.body = proto::Sent{e.conv, e.seq, e.mid, false, e.epoch};
        else
            continue;
        onOutcome(QString(), e.cmid, settled);
    }
}

} // namespace im
