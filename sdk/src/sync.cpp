#include "sync_p.h"

#include "client_p.h"

#include <QtCore/QSet>

namespace im {

Sync::Sync(ClientPrivate &dd) : d(dd) {
    convsTimer_.setSingleShot(true);
    convsTimer_.setInterval(200);
    connect(&convsTimer_, &QTimer::timeout, this, [this] { requestConvs(); });
}

void Sync::sessionEnded() {
    for (State &s : syncs_)
        s.running = false;
    convsTimer_.stop();
}

void Sync::syncAll() {
    if (!d.conn.isSessionUp())
        return;
    for (const QString &c : d.q->conversationIds())
        start(c);
}

void Sync::onResync() {
    syncAll();
    scheduleConvsRefresh();
}

void Sync::start(const QString &conv) {
    if (!d.conn.isSessionUp() || d.stale)
        return;
    State &s = syncs_[conv];
    if (s.running) {
        s.again = true;
        return;
    }
    std::optional<detail::ConvRow> row = d.storage.conversation(conv);
    if (!row) {
        if (!d.storage.ensureConversation(conv)) {
            d.storageFailed(QStringLiteral("cannot create conversation"));
            return;
        }
        row = d.storage.conversation(conv);
        if (!row) {
            d.storageFailed(QStringLiteral("cannot read conversation"));
            return;
        }
        emit d.q->conversationsChanged();
    }
    s.running = true;
    s.again = false;
    const QString rid = d.conn.nextRid();
    const qint64 after = row->after;
    d.conn.request(rid,
                   proto::encodeSync(rid, conv, after, pageSize,
                                     row->epoch > 0 ? std::optional<qint64>(row->epoch) : std::nullopt),
                   [this, conv, after](const std::optional<proto::Incoming> &reply) {
                       if (proto::classify(reply) != proto::Disposition::Success) {
                           onSyncFailed(conv, reply);
                       } else if (const auto *page = std::get_if<proto::Page>(&reply->body)) {
                           onPage(conv, after, *page);
                       } else {
                           emit d.q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"),
                                                   QStringLiteral("sync answered without page"));
                           onSyncFailed(conv, std::nullopt);
                       }
                   });
}

void Sync::onPage(const QString &conv, qint64 after, const proto::Page &page) {
    State &s = syncs_[conv];
    s.running = false;
    if (page.conv != conv) {
        emit d.q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page for another conversation"));
        onSyncFailed(conv, std::nullopt);
        return;
    }
    const std::optional<detail::ConvRow> row = d.storage.conversation(conv);
    if (row && row->epoch > 0 && page.epoch != row->epoch) {
        // The server answered under another epoch: our cursor is void.
        proto::Incoming fake;
        fake.body = proto::Error{QString::fromUtf16(proto::code::EpochChanged), QStringLiteral("page epoch moved")};
        onSyncFailed(conv, fake);
        return;
    }
    if (page.hasMore && page.nextAfter <= after) {
        emit d.q->errorOccurred(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page made no progress"));
        onSyncFailed(conv, std::nullopt);
        return;
    }
    // A5: events, markers and the new cursor in one transaction.
    if (!d.storage.applyPage(page)) {
        d.storageFailed(QStringLiteral("cannot apply page"));
        d.conn.retryLater(QStringLiteral("sync:") + conv, [this, conv] { start(conv); });
        return;
    }
    d.conn.retrySucceeded(QStringLiteral("sync:") + conv);
    d.outbox.settleOwnEvents(page.events);
    if (!page.events.isEmpty()) {
        emit d.q->eventsApplied(conv, page.events.first().seq, page.events.last().seq);
        notifyRecalls(conv, page.events);
        emit d.timelineChanged(conv);
    }
    emit d.q->conversationsChanged();
    d.markers.sendAck(conv);
    if (page.hasMore || syncs_[conv].again)
        start(conv);
    else
        emit d.q->conversationSynced(conv);
}

void Sync::onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply) {
    syncs_[conv].running = false;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = proto::errorCode(reply);
    if (disp != proto::Disposition::Terminal) {
        d.conn.retryLater(QStringLiteral("sync:") + conv, [this, conv] { start(conv); });
        return;
    }
    if (code == proto::code::EpochChanged) {
        // Old cursors are void: drop local events and cursor, rebuild from 0.
        if (!d.storage.resetConversation(conv, true)) {
            d.storageFailed(QStringLiteral("cannot reset conversation"));
            return;
        }
        emit d.q->conversationReset(conv);
        emit d.timelineChanged(conv);
        emit d.q->conversationsChanged();
        start(conv);
    } else if (code == proto::code::CursorAhead) {
        if (!d.storage.resetConversation(conv, false)) {
            d.storageFailed(QStringLiteral("cannot reset cursor"));
            return;
        }
        emit d.q->conversationsChanged();
        start(conv);
    } else if (code == proto::code::StaleInstall) {
        d.enterStale(proto::errorMessage(reply));
    } else {
        emit d.q->errorOccurred(code, proto::errorMessage(reply));
    }
}

void Sync::requestConvs(bool syncAfter) {
    if (!d.conn.isSessionUp())
        return;
    if (syncAfter)
        syncAfterConvs_ = true;
    const QString rid = d.conn.nextRid();
    d.conn.request(rid, proto::encodeConvs(rid), [this](const std::optional<proto::Incoming> &reply) { onConvs(reply); });
}

void Sync::onConvs(const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    if (disp == proto::Disposition::Retry) {
        d.conn.retryLater(QStringLiteral("convs"), [this] { requestConvs(); });
        return;
    }
    if (disp == proto::Disposition::Terminal) {
        emit d.q->errorOccurred(proto::errorCode(reply), proto::errorMessage(reply));
        return;
    }
    const auto *c = std::get_if<proto::Convs>(&reply->body);
    if (!c)
        return;
    d.conn.retrySucceeded(QStringLiteral("convs"));
    if (!d.storage.upsertConversations(c->convs)) {
        d.storageFailed(QStringLiteral("cannot store conversation list"));
        return;
    }
    emit d.q->conversationsChanged();
    if (syncAfterConvs_) {
        syncAfterConvs_ = false;
        for (const proto::ConvInfo &ci : c->convs)
            start(ci.conv);
    }
}

void Sync::scheduleConvsRefresh() {
    if (d.conn.isSessionUp() && !convsTimer_.isActive())
        convsTimer_.start();
}

void Sync::notifyRecalls(const QString &conv, const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.kind != u"recall")
            continue;
        const QString cmid = d.storage.cmidAt(conv, e.target);
        if (!cmid.isEmpty())
            emit d.q->messageStateChanged(conv, cmid, e.target, MessageState::Recalled, QString());
    }
}

void Sync::onEventPush(const proto::Event &ev) {
    if (!d.conn.isSessionUp() || d.stale)
        return;
    pushes_.append(ev);
    if (pushesQueued_)
        return;
    pushesQueued_ = true;
    QMetaObject::invokeMethod(this, [this] {
        pushesQueued_ = false;
        applyPushes();
    }, Qt::QueuedConnection);
}

void Sync::applyPushes() {
    const QList<proto::Event> events = std::exchange(pushes_, {});
    if (events.isEmpty() || !d.conn.isSessionUp() || d.stale)
        return;
    QList<bool> applied;
    if (!d.storage.applyPushedEvents(events, &applied)) {
        d.storageFailed(QStringLiteral("cannot apply pushed events"));
        QSet<QString> convs;
        for (const proto::Event &ev : events)
            convs.insert(ev.conv);
        for (const QString &conv : std::as_const(convs))
            start(conv);
        return;
    }
    QList<proto::Event> done;
    QStringList order;                       // conversations in first-seen order
    QHash<QString, QList<proto::Event>> byConv;
    QSet<QString> behind;
    for (qsizetype i = 0; i < events.size(); ++i) {
        const proto::Event &ev = events.at(i);
        if (!applied.at(i)) {
            behind.insert(ev.conv);
            continue;
        }
        done.append(ev);
        if (!byConv.contains(ev.conv))
            order.append(ev.conv);
        byConv[ev.conv].append(ev);
    }
    d.outbox.settleOwnEvents(done);
    for (const QString &conv : std::as_const(order)) {
        const QList<proto::Event> &evs = byConv.value(conv);
        emit d.q->eventsApplied(conv, evs.first().seq, evs.last().seq);
        notifyRecalls(conv, evs);
        emit d.timelineChanged(conv);
    }
    if (!done.isEmpty())
        emit d.q->conversationsChanged();
    for (const QString &conv : std::as_const(order))
        d.markers.sendAck(conv);
    // Not the next seq (a gap, a reorder, or an unknown conversation): pull.
    for (const QString &conv : std::as_const(behind)) {
        if (!d.storage.conversation(conv))
            scheduleConvsRefresh();
        start(conv);
    }
}

void Sync::onHint(const proto::Hint &h) {
    if (!d.conn.isSessionUp() || d.stale)
        return;
    std::optional<detail::ConvRow> row = d.storage.conversation(h.conv);
    if (!row && !d.storage.ensureConversation(h.conv)) {
        d.storageFailed(QStringLiteral("cannot create conversation"));
        return;
    }
    if (h.read) {
        if (!d.storage.setRead(h.conv, *h.read))
            d.storageFailed(QStringLiteral("cannot record read marker"));
        emit d.timelineChanged(h.conv);
    }
    if (!d.storage.updateHead(h.conv, h.head))
        d.storageFailed(QStringLiteral("cannot record head"));
    emit d.q->conversationsChanged();
    if (h.head > (row ? row->after : 0) || (row && row->epoch > 0 && h.epoch > 0 && h.epoch != row->epoch))
        start(h.conv);
    scheduleConvsRefresh();
}

} // namespace im
