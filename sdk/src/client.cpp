#include "client_p.h"

#include <QtCore/QDateTime>
#include <QtCore/QRandomGenerator>
#include <QtCore/QUuid>

#include <algorithm>

namespace im {
namespace {

qint64 nowMs() { return QDateTime::currentMSecsSinceEpoch(); }

QString errorCodeOf(const std::optional<proto::Incoming> &reply) {
    if (reply)
        if (const auto *e = std::get_if<proto::Error>(&reply->body))
            return e->code;
    return {};
}

QString errorMsgOf(const std::optional<proto::Incoming> &reply) {
    if (reply)
        if (const auto *e = std::get_if<proto::Error>(&reply->body))
            return e->msg;
    return {};
}

const QString StorageError = QStringLiteral("STORAGE_ERROR");

} // namespace

// ---------------------------------------------------------------------------
// ClientPrivate

ClientPrivate::ClientPrivate(Client *qq) : q(qq) {
    transport = new detail::Transport(this);
    connect(transport, &detail::Transport::opened, this, &ClientPrivate::onOpened);
    connect(transport, &detail::Transport::closed, this, &ClientPrivate::onClosed);
    connect(transport, &detail::Transport::textReceived, this, &ClientPrivate::onText);
    connect(transport, &detail::Transport::stateChanged, this, &ClientPrivate::onTransportState);
    tick.setInterval(50);
    connect(&tick, &QTimer::timeout, this, &ClientPrivate::onTick);
    convsTimer.setSingleShot(true);
    convsTimer.setInterval(200);
    connect(&convsTimer, &QTimer::timeout, this, &ClientPrivate::requestConvs);
}

ClientPrivate::~ClientPrivate() {
    transport->disconnect(this);
}

QString ClientPrivate::nextRid() { return QStringLiteral("r%1").arg(++ridCounter); }

int ClientPrivate::backoffMs(int attempt) const {
    // Capped exponential backoff with "equal jitter": [d/2, d].
    const int exp = std::clamp(attempt - 1, 0, 20);
    const qint64 d = std::min<qint64>(retryMaxMs, qint64(retryInitialMs) << exp);
    return int(d / 2 + QRandomGenerator::global()->bounded(d / 2 + 1));
}

void ClientPrivate::storageFailed(const QString &what) {
    lastError = QStringLiteral("%1: %2").arg(what, storage.lastError());
    emit q->errorOccurred(StorageError, lastError);
}

void ClientPrivate::setState(ConnectionState s) {
    if (s == state)
        return;
    state = s;
    if (s != ConnectionState::Connected)
        gateway.clear();
    emit q->connectionStateChanged(s);
}

bool ClientPrivate::transmit(Req kind, const QString &rid, const QByteArray &frame, const QString &conv,
                             const QString &cmid, qint64 seq) {
    Pending p;
    p.kind = kind;
    p.conv = conv;
    p.cmid = cmid;
    p.seq = seq;
    p.deadline = nowMs() + requestTimeoutMs;
    pending.insert(rid, p);
    if (!tick.isActive())
        tick.start();
    // A failed write leaves the request pending: it times out like a lost
    // reply, which is handled the same way.
    return transport->sendText(frame);
}

void ClientPrivate::onTransportState() {
    using TS = detail::Transport::State;
    switch (transport->state()) {
    case TS::Idle:
        setState(ConnectionState::Disconnected);
        break;
    case TS::Connecting:
    case TS::Open:
        if (!helloDone)
            setState(hadSession ? ConnectionState::Reconnecting : ConnectionState::Connecting);
        break;
    case TS::Waiting:
        setState(ConnectionState::Reconnecting);
        emit q->connectionStateChanged(state); // nextReconnectAt moved
        break;
    }
}

void ClientPrivate::onOpened() {
    helloDone = false;
    ++session;
    pending.clear();
    const QString rid = nextRid();
    transmit(Req::Hello, rid, proto::encodeHello(rid, token, installId));
}

void ClientPrivate::onClosed() {
    const bool hadHello = helloDone;
    helloDone = false;
    ++session;
    // Every request on the wire is now "no reply": outbox entries stay and
    // are resent after the next hello; everything else is redone then too.
    const auto old = pending;
    pending.clear();
    for (auto it = old.cbegin(); it != old.cend(); ++it)
        if ((it->kind == Req::Send || it->kind == Req::Recall) && !it->timedOut)
            onOutboxOutcome(it.key(), it->cmid, std::nullopt);
    for (auto &s : syncs)
        s.running = false;
    ackSent.clear();
    failures.clear();
    tick.stop();
    convsTimer.stop();
    if (hadHello)
        hadSession = true;
}

void ClientPrivate::onTick() {
    const qint64 now = nowMs();
    QList<QString> expired;
    for (auto it = pending.cbegin(); it != pending.cend(); ++it)
        if (!it->timedOut && it->deadline <= now)
            expired.append(it.key());
    for (const QString &rid : expired) {
        auto it = pending.find(rid);
        if (it == pending.end())
            continue;
        Pending p = *it;
        if (p.kind == Req::Send || p.kind == Req::Recall) {
            // Keep it: a late success still finalizes the entry.
            it->timedOut = true;
            onOutboxOutcome(rid, p.cmid, std::nullopt);
        } else {
            pending.erase(it);
            onReply(rid, p, std::nullopt);
        }
    }
    pump();
}

void ClientPrivate::onText(const QByteArray &frame) {
    QString err, rid;
    std::optional<proto::Incoming> in = proto::decode(frame, &err, &rid);
    if (!in) {
        // A malformed reply is treated as no reply (its request times out).
        emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), err);
        return;
    }
    if (!in->rid.isEmpty()) {
        auto it = pending.find(in->rid);
        if (it == pending.end())
            return; // late reply to a request already given up (not an outbox one)
        if (dropNext) { // QA hook
            dropNext = false;
            return;
        }
        Pending p = *it;
        pending.erase(it);
        if (p.timedOut) {
            if (p.kind == Req::Send || p.kind == Req::Recall)
                onOutboxOutcome(in->rid, p.cmid, in);
            return;
        }
        onReply(in->rid, p, in);
        return;
    }
    // Server-initiated frames (contract section 7).
    std::visit(
        [this](const auto &b) {
            using T = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<T, proto::EventPush>) {
                onEventPush(b.ev);
            } else if constexpr (std::is_same_v<T, proto::Hint>) {
                onHint(b);
            } else if constexpr (std::is_same_v<T, proto::Resync>) {
                q->syncAll();
                scheduleConvsRefresh();
            } else if constexpr (std::is_same_v<T, proto::Goaway>) {
                transport->moveToNextServer(int(b.retryMs.value_or(0)));
            } else if constexpr (std::is_same_v<T, proto::Error>) {
                if (b.code == proto::code::StaleInstall)
                    enterStale(b.msg);
                else
                    emit q->errorOccurred(b.code, b.msg);
            }
        },
        in->body);
}

void ClientPrivate::onReply(const QString &rid, Pending p, const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    const QString code = errorCodeOf(reply);
    if (disp == proto::Disposition::Terminal && code == proto::code::StaleInstall && p.kind != Req::Hello) {
        enterStale(errorMsgOf(reply));
        return;
    }
    switch (p.kind) {
    case Req::Hello: {
        if (disp == proto::Disposition::Success) {
            const auto *w = std::get_if<proto::Welcome>(&reply->body);
            if (!w) {
                emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("hello answered without welcome"));
                transport->abortNow();
                return;
            }
            if (w->user != userId || w->device != deviceId) {
                if (!storage.setMeta(QStringLiteral("user"), w->user)
                    || !storage.setMeta(QStringLiteral("device"), w->device)) {
                    storageFailed(QStringLiteral("cannot record identity"));
                    transport->abortNow();
                    return;
                }
                userId = w->user;
                deviceId = w->device;
                emit q->identityChanged();
            }
            gateway = w->gateway;
            helloDone = true;
            transport->resetBackoff();
            state = ConnectionState::Reconnecting; // force the emission below
            setState(ConnectionState::Connected);
            const QString sub = nextRid();
            transmit(Req::Sub, sub, proto::encodeSub(sub));
            syncAfterConvs = true;
            requestConvs();
            sendPendingReads();
            q->resendPending();
        } else if (code == proto::code::StaleInstall) {
            enterStale(errorMsgOf(reply));
        } else if (disp == proto::Disposition::Retry) {
            transport->abortNow(); // reconnect with backoff
        } else {
            lastError = QStringLiteral("%1: %2").arg(code, errorMsgOf(reply));
            wantConnected = false;
            transport->stop();
            setState(ConnectionState::Disconnected);
            emit q->errorOccurred(code, errorMsgOf(reply));
        }
        return;
    }
    case Req::Send:
    case Req::Recall:
        onOutboxOutcome(rid, p.cmid, reply);
        return;
    case Req::Sync:
        if (disp == proto::Disposition::Success) {
            if (const auto *page = std::get_if<proto::Page>(&reply->body)) {
                onPage(p, *page);
                return;
            }
            emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("sync answered without page"));
            onSyncFailed(p.conv, std::nullopt);
            return;
        }
        onSyncFailed(p.conv, reply);
        return;
    case Req::Ack:
        if (disp == proto::Disposition::Success) {
            if (const auto *a = std::get_if<proto::Acked>(&reply->body)) {
                if (!storage.setDelivered(a->conv, a->delivered))
                    storageFailed(QStringLiteral("cannot record delivered marker"));
                emit q->conversationsChanged();
            }
        } else if (disp == proto::Disposition::Retry) {
            ackSent.remove(p.conv); // the next applied page or push acks again
            const QString conv = p.conv;
            retryLater(QStringLiteral("ack:") + conv, [this, conv] { sendAck(conv); });
        } else {
            emit q->errorOccurred(code, errorMsgOf(reply));
        }
        return;
    case Req::Read:
        if (disp == proto::Disposition::Success) {
            if (const auto *r = std::get_if<proto::ReadOk>(&reply->body)) {
                if (!storage.setRead(r->conv, r->read))
                    storageFailed(QStringLiteral("cannot record read marker"));
                failures.remove(QStringLiteral("read:") + r->conv);
                emit q->conversationsChanged();
                emit timelineChanged(r->conv);
                scheduleConvsRefresh();
            }
        } else if (disp == proto::Disposition::Retry) {
            retryLater(QStringLiteral("read:") + p.conv, [this] { sendPendingReads(); });
        } else {
            if (!storage.clearReadPending(p.conv))
                storageFailed(QStringLiteral("cannot clear read marker"));
            emit q->errorOccurred(code, errorMsgOf(reply));
        }
        return;
    case Req::Convs:
        if (disp == proto::Disposition::Success) {
            if (const auto *c = std::get_if<proto::Convs>(&reply->body)) {
                failures.remove(QStringLiteral("convs"));
                if (!storage.upsertConversations(c->convs)) {
                    storageFailed(QStringLiteral("cannot store conversation list"));
                    return;
                }
                emit q->conversationsChanged();
                if (syncAfterConvs) {
                    syncAfterConvs = false;
                    for (const proto::ConvInfo &ci : c->convs)
                        startSync(ci.conv);
                }
            }
        } else if (disp == proto::Disposition::Retry) {
            retryLater(QStringLiteral("convs"), [this] { requestConvs(); });
        } else {
            emit q->errorOccurred(code, errorMsgOf(reply));
        }
        return;
    case Req::Sub:
        if (disp == proto::Disposition::Retry) {
            retryLater(QStringLiteral("sub"), [this] {
                const QString rid = nextRid();
                transmit(Req::Sub, rid, proto::encodeSub(rid));
            });
        } else if (disp == proto::Disposition::Terminal) {
            emit q->errorOccurred(code, errorMsgOf(reply));
        }
        return;
    }
}

void ClientPrivate::retryLater(const QString &key, std::function<void()> fn) {
    const int attempt = ++failures[key];
    const quint64 s = session;
    QTimer::singleShot(backoffMs(attempt), this, [this, s, fn = std::move(fn)] {
        // A new session redoes everything after hello anyway.
        if (s == session && isSessionUp())
            fn();
    });
}

// --- outbox ----------------------------------------------------------------

QString ClientPrivate::enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target) {
    if (!storage.isOpen()) {
        lastError = QStringLiteral("database not open");
        emit q->errorOccurred(QStringLiteral("INVALID_ARGUMENT"), lastError);
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
    row.id = storage.enqueue(row);
    if (row.id == 0) {
        storageFailed(QStringLiteral("cannot write outbox"));
        return {};
    }
    outbox.emplace(row.id, OutItem{row, false, {}});
    outboxIds.insert(row.cmid, row.id);
    emit q->messageStateChanged(conv, row.cmid, 0, MessageState::Pending, QString());
    emit q->outboxChanged();
    emit timelineChanged(conv);
    schedulePump();
    return row.cmid;
}

void ClientPrivate::schedulePump() {
    if (pumpQueued)
        return;
    pumpQueued = true;
    QMetaObject::invokeMethod(this, [this] {
        pumpQueued = false;
        pump();
    }, Qt::QueuedConnection);
}

void ClientPrivate::pump() {
    if (!isSessionUp() || stale)
        return;
    const qint64 now = nowMs();
    bool sent = false;
    for (auto &[id, item] : outbox) {
        if (inFlight >= window)
            break;
        if (item.inFlight || item.row.nextRetryAt > now)
            continue;
        const QString rid = nextRid();
        const QByteArray frame = item.row.kind == u"recall"
                                     ? proto::encodeRecall(rid, item.row.conv, item.row.target, item.row.cmid)
                                     : proto::encodeSend(rid, item.row.conv, item.row.cmid, item.row.body);
        ++item.row.attempts;
        item.inFlight = true;
        item.rid = rid;
        ++inFlight;
        sent = true;
        transmit(item.row.kind == u"recall" ? Req::Recall : Req::Send, rid, frame, item.row.conv, item.row.cmid);
    }
    if (sent)
        emit q->outboxChanged();
}

void ClientPrivate::onOutboxOutcome(const QString &rid, const QString &cmid,
                                    const std::optional<proto::Incoming> &reply) {
    const auto idIt = outboxIds.constFind(cmid);
    if (idIt == outboxIds.cend())
        return; // already final (e.g. a late duplicate reply)
    const qint64 id = *idIt;
    OutItem &item = outbox.at(id);
    const bool current = item.inFlight && item.rid == rid;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = errorCodeOf(reply);

    if (disp == proto::Disposition::Retry) {
        if (!current)
            return; // an older attempt; a newer one is on the wire
        item.inFlight = false;
        --inFlight;
        item.row.lastError = !code.isEmpty() ? code
                             : isSessionUp() ? QStringLiteral("TIMEOUT")
                                             : QStringLiteral("DISCONNECTED");
        item.row.nextRetryAt = nowMs() + backoffMs(item.row.attempts);
        if (!storage.recordRetry(cmid, item.row.attempts, item.row.lastError, item.row.nextRetryAt))
            storageFailed(QStringLiteral("cannot record retry"));
        emit q->outboxChanged();
        return;
    }
    if (code == proto::code::StaleInstall) {
        // Not a verdict on the message: the install is stale. Keep the entry
        // (resetInstall() keeps the outbox) and stop.
        if (current) {
            item.inFlight = false;
            --inFlight;
        }
        enterStale(errorMsgOf(reply));
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
            emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("unexpected reply to send/recall"));
            if (current) {
                item.inFlight = false;
                --inFlight;
                item.row.nextRetryAt = nowMs() + backoffMs(item.row.attempts);
            }
            return;
        }
    } else {
        // A4: ORIGINAL_EXPIRED means "sent once, purged": Expired, never resent.
        finalState = code == proto::code::OriginalExpired ? MessageState::Expired : MessageState::Failed;
    }
    if (!storage.finishOutbox(cmid, int(finalState), disp == proto::Disposition::Terminal ? code : QString(), seq,
                              dup, epoch)) {
        // Keep the entry: a resend gets the same answer (dup) and we try again.
        storageFailed(QStringLiteral("cannot finish outbox entry"));
        if (current) {
            item.inFlight = false;
            --inFlight;
            item.row.nextRetryAt = nowMs() + backoffMs(item.row.attempts);
        }
        return;
    }
    if (item.inFlight)
        --inFlight;
    const QString conv = item.row.conv;
    outbox.erase(id);
    outboxIds.remove(cmid);
    emit q->messageStateChanged(conv, cmid, seq, finalState,
                                disp == proto::Disposition::Terminal ? code : QString());
    emit q->outboxChanged();
    emit timelineChanged(conv);
    schedulePump();
}

void ClientPrivate::settleOwnEvents(const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.cmid.isEmpty() || e.sender != userId || !outboxIds.contains(e.cmid))
            continue;
        // The committed event is the answer: seq and mid are permanent.
        proto::Incoming settled;
        if (e.kind == u"recall")
            settled.body = proto::Recalled{e.conv, e.seq, false};
        else if (e.kind == u"msg")
            settled.body = proto::Sent{e.conv, e.seq, e.mid, false, e.epoch};
        else
            continue;
        onOutboxOutcome(QString(), e.cmid, settled);
    }
}

// --- sync ------------------------------------------------------------------

void ClientPrivate::startSync(const QString &conv) {
    if (!isSessionUp() || stale)
        return;
    SyncState &s = syncs[conv];
    if (s.running) {
        s.again = true;
        return;
    }
    std::optional<detail::ConvRow> row = storage.conversation(conv);
    if (!row) {
        if (!storage.ensureConversation(conv)) {
            storageFailed(QStringLiteral("cannot create conversation"));
            return;
        }
        row = storage.conversation(conv);
        if (!row) {
            storageFailed(QStringLiteral("cannot read conversation"));
            return;
        }
        emit q->conversationsChanged();
    }
    s.running = true;
    s.again = false;
    const QString rid = nextRid();
    transmit(Req::Sync, rid,
             proto::encodeSync(rid, conv, row->after, pageSize,
                               row->epoch > 0 ? std::optional<qint64>(row->epoch) : std::nullopt),
             conv, QString(), row->after);
}

void ClientPrivate::onPage(const Pending &p, const proto::Page &page) {
    SyncState &s = syncs[p.conv];
    s.running = false;
    if (page.conv != p.conv) {
        emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page for another conversation"));
        onSyncFailed(p.conv, std::nullopt);
        return;
    }
    const std::optional<detail::ConvRow> row = storage.conversation(p.conv);
    if (row && row->epoch > 0 && page.epoch != row->epoch) {
        // The server answered under another epoch: our cursor is void.
        proto::Incoming fake;
        fake.body = proto::Error{QString::fromUtf16(proto::code::EpochChanged), QStringLiteral("page epoch moved")};
        onSyncFailed(p.conv, fake);
        return;
    }
    if (page.hasMore && page.nextAfter <= p.seq) {
        emit q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page made no progress"));
        onSyncFailed(p.conv, std::nullopt);
        return;
    }
    // A5: events, markers and the new cursor in one transaction.
    if (!storage.applyPage(page)) {
        storageFailed(QStringLiteral("cannot apply page"));
        const QString conv = p.conv;
        retryLater(QStringLiteral("sync:") + conv, [this, conv] { startSync(conv); });
        return;
    }
    failures.remove(QStringLiteral("sync:") + p.conv);
    settleOwnEvents(page.events);
    if (!page.events.isEmpty()) {
        emit q->eventsApplied(p.conv, page.events.first().seq, page.events.last().seq);
        notifyRecalls(p.conv, page.events);
        emit timelineChanged(p.conv);
    }
    emit q->conversationsChanged();
    sendAck(p.conv);
    if (page.hasMore || s.again) {
        startSync(p.conv);
    } else {
        emit q->conversationSynced(p.conv);
    }
}

void ClientPrivate::onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply) {
    syncs[conv].running = false;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = errorCodeOf(reply);
    if (disp != proto::Disposition::Terminal) {
        retryLater(QStringLiteral("sync:") + conv, [this, conv] { startSync(conv); });
        return;
    }
    if (code == proto::code::EpochChanged) {
        // Old cursors are void: drop local events and cursor, rebuild from 0.
        if (!storage.resetConversation(conv, true)) {
            storageFailed(QStringLiteral("cannot reset conversation"));
            return;
        }
        emit q->conversationReset(conv);
        emit timelineChanged(conv);
        emit q->conversationsChanged();
        startSync(conv);
    } else if (code == proto::code::CursorAhead) {
        if (!storage.resetConversation(conv, false)) {
            storageFailed(QStringLiteral("cannot reset cursor"));
            return;
        }
        emit q->conversationsChanged();
        startSync(conv);
    } else if (code == proto::code::StaleInstall) {
        enterStale(errorMsgOf(reply));
    } else {
        emit q->errorOccurred(code, errorMsgOf(reply));
    }
}

void ClientPrivate::sendAck(const QString &conv) {
    if (!isSessionUp())
        return;
    const std::optional<detail::ConvRow> row = storage.conversation(conv);
    if (!row || row->after <= 0 || row->after <= row->delivered || row->after <= ackSent.value(conv, 0))
        return;
    ackSent.insert(conv, row->after);
    const QString rid = nextRid();
    transmit(Req::Ack, rid, proto::encodeAck(rid, conv, row->after), conv, QString(), row->after);
}

void ClientPrivate::requestConvs() {
    if (!isSessionUp())
        return;
    const QString rid = nextRid();
    transmit(Req::Convs, rid, proto::encodeConvs(rid));
}

void ClientPrivate::scheduleConvsRefresh() {
    if (isSessionUp() && !convsTimer.isActive())
        convsTimer.start();
}

void ClientPrivate::sendPendingReads() {
    if (!isSessionUp())
        return;
    const std::optional<QList<detail::ConvRow>> rows = storage.conversations();
    if (!rows) {
        storageFailed(QStringLiteral("cannot read conversations"));
        return;
    }
    for (const detail::ConvRow &c : *rows) {
        if (c.readPending > c.read) {
            const QString rid = nextRid();
            transmit(Req::Read, rid, proto::encodeRead(rid, c.conv, c.readPending), c.conv, QString(), c.readPending);
        }
    }
}

void ClientPrivate::notifyRecalls(const QString &conv, const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.kind != u"recall")
            continue;
        const QString cmid = storage.cmidAt(conv, e.target);
        if (!cmid.isEmpty())
            emit q->messageStateChanged(conv, cmid, e.target, MessageState::Recalled, QString());
    }
}

// --- pushes ----------------------------------------------------------------

void ClientPrivate::onEventPush(const proto::Event &ev) {
    if (!isSessionUp() || stale)
        return;
    bool applied = false;
    if (!storage.applyPushedEvent(ev, &applied)) {
        storageFailed(QStringLiteral("cannot apply pushed event"));
        startSync(ev.conv);
        return;
    }
    if (!applied) {
        // Not the next seq (a gap, a reorder, or an unknown conversation): pull.
        if (!storage.conversation(ev.conv))
            scheduleConvsRefresh();
        startSync(ev.conv);
        return;
    }
    settleOwnEvents({ev});
    emit q->eventsApplied(ev.conv, ev.seq, ev.seq);
    notifyRecalls(ev.conv, {ev});
    emit timelineChanged(ev.conv);
    emit q->conversationsChanged();
    sendAck(ev.conv);
}

void ClientPrivate::onHint(const proto::Hint &h) {
    if (!isSessionUp() || stale)
        return;
    std::optional<detail::ConvRow> row = storage.conversation(h.conv);
    if (!row) {
        if (!storage.ensureConversation(h.conv)) {
            storageFailed(QStringLiteral("cannot create conversation"));
            return;
        }
    }
    if (h.read) {
        if (!storage.setRead(h.conv, *h.read))
            storageFailed(QStringLiteral("cannot record read marker"));
        emit timelineChanged(h.conv);
    }
    if (!storage.updateHead(h.conv, h.head))
        storageFailed(QStringLiteral("cannot record head"));
    emit q->conversationsChanged();
    if (h.head > (row ? row->after : 0) || (row && row->epoch > 0 && h.epoch > 0 && h.epoch != row->epoch))
        startSync(h.conv);
    scheduleConvsRefresh();
}

void ClientPrivate::enterStale(const QString &message) {
    const bool was = stale;
    stale = true;
    lastError = QStringLiteral("STALE_INSTALL: %1").arg(message);
    if (!storage.setMeta(QStringLiteral("install_stale"), QStringLiteral("1")))
        storageFailed(QStringLiteral("cannot record stale install"));
    transport->stop();
    setState(ConnectionState::Disconnected);
    if (!was) {
        emit q->installStaleChanged(true);
        emit q->errorOccurred(QString::fromUtf16(proto::code::StaleInstall), message);
    }
}

// ---------------------------------------------------------------------------
// Client

Client::Client(QObject *parent) : QObject(parent), d(std::make_unique<ClientPrivate>(this)) {}

Client::~Client() {
    d->transport->stop();
}

void Client::setServers(const QList<QUrl> &servers) {
    d->urls = servers;
    d->transport->setUrls(servers);
}
QList<QUrl> Client::servers() const { return d->urls; }
void Client::setCredentials(const QString &token) { d->token = token; }

void Client::setRequestTimeout(int ms) {
    ms = std::max(1, ms);
    if (ms == d->requestTimeoutMs)
        return;
    d->requestTimeoutMs = ms;
    emit requestTimeoutChanged(ms);
}
int Client::requestTimeout() const { return d->requestTimeoutMs; }

void Client::setRetryBackoff(int initialMs, int maxMs) {
    d->retryInitialMs = std::max(1, initialMs);
    d->retryMaxMs = std::max(d->retryInitialMs, maxMs);
}
void Client::setReconnectBackoff(int initialMs, int maxMs) { d->transport->setBackoff(initialMs, maxMs); }
void Client::setSyncPageSize(int limit) { d->pageSize = std::clamp(limit, 1, 200); }
void Client::setSendWindow(int requests) { d->window = std::max(1, requests); }

bool Client::open(const QString &databasePath) {
    close();
    if (!d->storage.open(databasePath)) {
        d->lastError = d->storage.lastError();
        emit errorOccurred(StorageError, d->lastError);
        return false;
    }
    auto fail = [this](const QString &what) {
        d->lastError = QStringLiteral("%1: %2").arg(what, d->storage.lastError());
        d->storage.close();
        emit errorOccurred(StorageError, d->lastError);
        return false;
    };
    std::optional<QString> install = d->storage.meta(QStringLiteral("install_id"));
    if (!install)
        return fail(QStringLiteral("cannot read install id"));
    if (install->isEmpty()) {
        // Generated once per database (= per installation) and kept.
        *install = QUuid::createUuid().toString(QUuid::WithoutBraces);
        if (!d->storage.setMeta(QStringLiteral("install_id"), *install))
            return fail(QStringLiteral("cannot store install id"));
    }
    const std::optional<QString> staleFlag = d->storage.meta(QStringLiteral("install_stale"));
    const std::optional<QString> user = d->storage.meta(QStringLiteral("user"));
    const std::optional<QString> device = d->storage.meta(QStringLiteral("device"));
    const std::optional<QList<detail::OutboxRow>> rows = d->storage.loadOutbox();
    if (!staleFlag || !user || !device || !rows)
        return fail(QStringLiteral("cannot load local state"));
    d->installId = *install;
    d->userId = *user;
    d->deviceId = *device;
    const bool wasStale = d->stale;
    d->stale = *staleFlag == u"1";
    for (const detail::OutboxRow &r : *rows) {
        d->outbox.emplace(r.id, ClientPrivate::OutItem{r, false, {}});
        d->outboxIds.insert(r.cmid, r.id);
    }
    emit installIdChanged();
    emit identityChanged();
    if (wasStale != d->stale)
        emit installStaleChanged(d->stale);
    emit outboxChanged();
    emit conversationsChanged();
    return true;
}

bool Client::isOpen() const { return d->storage.isOpen(); }

void Client::close() {
    if (!d->storage.isOpen())
        return;
    disconnectFromServer();
    d->outbox.clear();
    d->outboxIds.clear();
    d->inFlight = 0;
    d->syncs.clear();
    d->storage.close();
    emit outboxChanged();
    emit conversationsChanged();
}

QString Client::databasePath() const { return d->storage.path(); }
QString Client::lastError() const { return d->lastError; }
ConnectionState Client::connectionState() const { return d->state; }
QString Client::gatewayId() const { return d->gateway; }
QUrl Client::currentServer() const { return d->transport->currentUrl(); }
QDateTime Client::nextReconnectAt() const {
    return d->state == ConnectionState::Reconnecting ? d->transport->nextAttemptAt() : QDateTime();
}
QString Client::userId() const { return d->userId; }
QString Client::deviceId() const { return d->deviceId; }
QString Client::installId() const { return d->installId; }
bool Client::isInstallStale() const { return d->stale; }
int Client::pendingCount() const { return int(d->outbox.size()); }
bool Client::isOffline() const { return d->offline; }

QList<OutboxEntry> Client::outbox() const {
    QList<OutboxEntry> out;
    out.reserve(qsizetype(d->outbox.size()));
    for (const auto &[id, item] : d->outbox) {
        OutboxEntry e;
        e.cmid = item.row.cmid;
        e.conv = item.row.conv;
        e.kind = item.row.kind;
        e.body = item.row.body;
        e.target = item.row.target;
        e.attempts = item.row.attempts;
        e.lastError = item.row.lastError;
        if (item.row.nextRetryAt > 0)
            e.nextRetryAt = QDateTime::fromMSecsSinceEpoch(item.row.nextRetryAt);
        e.createdAt = QDateTime::fromMSecsSinceEpoch(item.row.createdAt);
        e.inFlight = item.inFlight;
        out.append(e);
    }
    return out;
}

MessageState Client::messageState(const QString &cmid) const {
    if (d->outboxIds.contains(cmid) || !d->storage.isOpen())
        return MessageState::Pending;
    const std::optional<detail::LocalMessage> m = d->storage.localMessage(cmid);
    if (!m)
        return MessageState::Pending;
    if (m->kind == u"send" && m->seq > 0 && MessageState(m->state) == MessageState::Sent
        && !d->storage.cmidAt(m->conv, m->seq).isEmpty()) {
        const std::optional<QList<detail::MessageRow>> rows = d->storage.messages(m->conv, d->userId);
        if (rows)
            for (const detail::MessageRow &r : *rows)
                if (r.cmid == cmid)
                    return MessageState(r.state);
    }
    return MessageState(m->state);
}

QStringList Client::conversationIds() const {
    QStringList ids;
    if (!d->storage.isOpen())
        return ids;
    const std::optional<QList<detail::ConvRow>> rows = d->storage.conversations();
    if (rows)
        for (const detail::ConvRow &c : *rows)
            ids.append(c.conv);
    return ids;
}

void Client::connectToServer() {
    if (!d->storage.isOpen()) {
        d->lastError = QStringLiteral("open() the database first");
        emit errorOccurred(QStringLiteral("INVALID_ARGUMENT"), d->lastError);
        return;
    }
    if (d->stale) {
        d->lastError = QStringLiteral("install is stale; call resetInstall()");
        emit errorOccurred(QString::fromUtf16(proto::code::StaleInstall), d->lastError);
        return;
    }
    d->wantConnected = true;
    if (d->offline || d->transport->isRunning())
        return;
    d->hadSession = false;
    d->transport->start();
}

void Client::disconnectFromServer() {
    d->wantConnected = false;
    d->transport->stop();
    d->setState(ConnectionState::Disconnected);
}

QString Client::send(const QString &conv, const QString &body) {
    if (conv.isEmpty() || body.isEmpty()) {
        d->lastError = QStringLiteral("send needs a conversation and a non-empty body");
        emit errorOccurred(QStringLiteral("INVALID_ARGUMENT"), d->lastError);
        return {};
    }
    return d->enqueue(QStringLiteral("send"), conv, body, 0);
}

QString Client::recall(const QString &conv, qint64 seq) {
    if (conv.isEmpty() || seq < 1) {
        d->lastError = QStringLiteral("recall needs a conversation and a seq >= 1");
        emit errorOccurred(QStringLiteral("INVALID_ARGUMENT"), d->lastError);
        return {};
    }
    return d->enqueue(QStringLiteral("recall"), conv, QString(), seq);
}

bool Client::markRead(const QString &conv, qint64 seq) {
    if (!d->storage.isOpen() || conv.isEmpty() || seq < 1) {
        d->lastError = QStringLiteral("markRead needs an open database, a conversation and a seq >= 1");
        emit errorOccurred(QStringLiteral("INVALID_ARGUMENT"), d->lastError);
        return false;
    }
    if (!d->storage.ensureConversation(conv) || !d->storage.setReadPending(conv, seq)) {
        d->storageFailed(QStringLiteral("cannot record read marker"));
        return false;
    }
    if (d->isSessionUp()) {
        const QString rid = d->nextRid();
        d->transmit(ClientPrivate::Req::Read, rid, proto::encodeRead(rid, conv, seq), conv, QString(), seq);
    }
    return true;
}

void Client::sync(const QString &conv) { d->startSync(conv); }

void Client::syncAll() {
    if (!d->isSessionUp())
        return;
    for (const QString &c : conversationIds())
        d->startSync(c);
}

void Client::resendPending() {
    for (auto &[id, item] : d->outbox)
        if (!item.inFlight)
            item.row.nextRetryAt = 0;
    d->pump();
}

bool Client::resetInstall() {
    if (!d->storage.isOpen())
        return false;
    disconnectFromServer();
    const QStringList convs = conversationIds();
    const QString fresh = QUuid::createUuid().toString(QUuid::WithoutBraces);
    if (!d->storage.resetInstallState(fresh)) {
        d->storageFailed(QStringLiteral("cannot reset install"));
        return false;
    }
    d->syncs.clear();
    d->installId = fresh;
    emit installIdChanged();
    if (d->stale) {
        d->stale = false;
        emit installStaleChanged(false);
    }
    for (const QString &c : convs) {
        emit conversationReset(c);
        emit d->timelineChanged(c);
    }
    emit conversationsChanged();
    return true;
}

void Client::setOffline(bool offline) {
    if (offline == d->offline)
        return;
    d->offline = offline;
    emit offlineChanged(offline);
    if (offline) {
        d->transport->stop();
        d->setState(ConnectionState::Disconnected);
    } else if (d->wantConnected && !d->stale && d->storage.isOpen()) {
        d->hadSession = false;
        d->transport->start();
    }
}

void Client::dropNextReply() { d->dropNext = true; }
void Client::closeSocketNow() { d->transport->abortNow(); }

} // namespace im
