#include "sync_p.h"

#include "connection_p.h"
#include "logging_p.h"

#include <QtCore/QSet>

namespace im {

Sync::Sync(detail::Storage &storage, Connection &conn, detail::Reporter &reporter, const detail::Identity &identity)
    : storage_(storage), conn_(conn), reporter_(reporter), id_(identity) {
    convsTimer_.setSingleShot(true);
    connect(&convsTimer_, &QTimer::timeout, this, [this] {
        if (convsRunning_) {
            // A walk under way may have passed the conversation already:
            // one more once it is over (still no sooner than the interval).
            refreshAfterWalk_ = true;
            return;
        }
        requestConvs();
    });
}

void Sync::sessionEnded() {
    for (State &s : syncs_)
        s.running = false;
    for (const QString &conv : std::exchange(older_, {}))
        emit windowLoaded(conv, false);
    queue_.clear();
    queued_.clear();
    active_.clear();
    convsRunning_ = false;
    convsAgain_ = false;
    syncAfterConvs_ = false;
    refreshAfterWalk_ = false;
    convsTimer_.stop();
}

void Sync::syncAll() {
    if (!conn_.isSessionUp())
        return;
    const std::optional<QList<detail::ConvRow>> rows = storage_.conversations();
    if (!rows) {
        reporter_.storageFailed(QStringLiteral("cannot read conversations"), storage_.lastError());
        return;
    }
    for (const detail::ConvRow &c : *rows)
        start(c.conv);
}

void Sync::onResync() {
    // The gateway may have missed notifications: walk the list and sync
    // every conversation whose head moved past its cursor.
    requestConvs(true);
}

void Sync::start(const QString &conv) {
    if (!conn_.isSessionUp() || id_.stale)
        return;
    State &s = syncs_[conv];
    if (s.running) {
        s.again = true;
        return;
    }
    if (queued_.contains(conv))
        return;
    if (!active_.contains(conv)) {
        if (active_.size() >= maxConcurrent) {
            queue_.enqueue(conv);
            queued_.insert(conv);
            return;
        }
        active_.insert(conv);
        peakActive_ = std::max(peakActive_, int(active_.size()));
    }
    launch(conv);
}

void Sync::release(const QString &conv) {
    active_.remove(conv);
    while (!queue_.isEmpty() && active_.size() < maxConcurrent) {
        const QString next = queue_.dequeue();
        queued_.remove(next);
        start(next);
    }
}

void Sync::launch(const QString &conv) {
    State &s = syncs_[conv];
    std::optional<detail::ConvRow> row = storage_.conversation(conv);
    if (!row) {
        if (!storage_.ensureConversation(conv)) {
            reporter_.storageFailed(QStringLiteral("cannot create conversation"), storage_.lastError());
            release(conv);
            return;
        }
        row = storage_.conversation(conv);
        if (!row) {
            reporter_.storageFailed(QStringLiteral("cannot read conversation"), storage_.lastError());
            release(conv);
            return;
        }
        emit conversationsChanged();
    }
    s.running = true;
    s.again = false;
    const QString rid = conn_.nextRid();
    const qint64 after = row->after;
    ++syncRequests_;
    const std::optional<qint64> epoch = row->epoch > 0 ? std::optional<qint64>(row->epoch) : std::nullopt;
    if (backlogLimit > 0 && row->head - after > backlogLimit) {
        // New to this install, or far behind: take the newest window and
        // leave [after + 1, oldest - 1] as a gap, filled on demand.
        qCInfo(lcSync, "%s: %lld events behind (backlog limit %d): newest window of %d, a gap below", qUtf8Printable(conv), row->head - after, backlogLimit, historyWindow);
        conn_.request(rid, proto::encodeHistory(rid, conv, 0, historyWindow, epoch),
                       [this, conv, after, epoch](const std::optional<proto::Incoming> &reply) {
                           if (proto::classify(reply) != proto::Disposition::Success) {
                               onSyncFailed(conv, reply);
                           } else if (const auto *page = std::get_if<proto::Page>(&reply->body); page && page->history) {
                               onWindow(conv, after + 1, epoch.value_or(0), *page);
                           } else {
                               reporter_.report(QStringLiteral("PROTOCOL_ERROR"),
                                                       QStringLiteral("history answered without window"));
                               onSyncFailed(conv, std::nullopt);
                           }
                       });
        return;
    }
    conn_.request(rid,
                   proto::encodeSync(rid, conv, after, pageSize,
                                     row->epoch > 0 ? std::optional<qint64>(row->epoch) : std::nullopt),
                   [this, conv, after](const std::optional<proto::Incoming> &reply) {
                       if (proto::classify(reply) != proto::Disposition::Success) {
                           onSyncFailed(conv, reply);
                       } else if (const auto *page = std::get_if<proto::Page>(&reply->body); page && !page->history) {
                           onPage(conv, after, *page);
                       } else {
                           reporter_.report(QStringLiteral("PROTOCOL_ERROR"),
                                                   QStringLiteral("sync answered without page"));
                           onSyncFailed(conv, std::nullopt);
                       }
                   });
}

void Sync::onPage(const QString &conv, qint64 after, const proto::Page &page) {
    State &s = syncs_[conv];
    s.running = false;
    if (page.conv != conv) {
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page for another conversation"));
        onSyncFailed(conv, std::nullopt);
        return;
    }
    const std::optional<detail::ConvRow> row = storage_.conversation(conv);
    if (row && row->epoch > 0 && page.epoch != row->epoch) {
        // The server answered under another epoch: our cursor is void.
        proto::Incoming fake;
        fake.body = proto::Error{QString::fromUtf16(proto::code::EpochChanged), QStringLiteral("page epoch moved"), std::nullopt};
        onSyncFailed(conv, fake);
        return;
    }
    if (page.hasMore && page.nextAfter <= after) {
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("page made no progress"));
        onSyncFailed(conv, std::nullopt);
        return;
    }
    // A5: events, markers and the new cursor in one transaction.
    if (!storage_.applyPage(page)) {
        reporter_.storageFailed(QStringLiteral("cannot apply page"), storage_.lastError());
        release(conv);
        conn_.retryLater(QStringLiteral("sync:") + conv, [this, conv] { start(conv); });
        return;
    }
    conn_.retrySucceeded(QStringLiteral("sync:") + conv);
    qCDebug(lcSync, "%s: page after %lld: %lld events, head %lld%s", qUtf8Printable(conv), after, qint64(page.events.size()), page.head, page.hasMore ? ", more" : "");
    handOverRequeued();
    applied(conv, page.events);
    if (page.hasMore || syncs_[conv].again) {
        start(conv);
    } else {
        release(conv);
        emit conversationSynced(conv);
    }
}

void Sync::onWindow(const QString &conv, qint64 gapLo, qint64 epoch, const proto::Page &page) {
    syncs_[conv].running = false;
    if (page.conv != conv) {
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("window for another conversation"));
        onSyncFailed(conv, std::nullopt);
        return;
    }
    if (epoch > 0 && page.epoch != epoch) {
        proto::Incoming fake;
        fake.body = proto::Error{QString::fromUtf16(proto::code::EpochChanged), QStringLiteral("window epoch moved"), std::nullopt};
        onSyncFailed(conv, fake);
        return;
    }
    // The window, the cursor at its head and the gap below it: one transaction.
    if (!storage_.applyWindow(page, 0, gapLo)) {
        reporter_.storageFailed(QStringLiteral("cannot apply history window"), storage_.lastError());
        release(conv);
        conn_.retryLater(QStringLiteral("sync:") + conv, [this, conv] { start(conv); });
        return;
    }
    conn_.retrySucceeded(QStringLiteral("sync:") + conv);
    qCInfo(lcSync, "%s: window of %lld events stored up to head %lld; gap from seq %lld", qUtf8Printable(conv), qint64(page.events.size()), page.head, gapLo);
    handOverRequeued();
    applied(conv, page.events);
    // Forward from the window's head, as usual (events may have come since).
    start(conv);
}

void Sync::handOverRequeued() {
    QList<detail::OutboxRow> rows = storage_.takeRequeued();
    if (!rows.isEmpty()) {
        qCInfo(lcSync, "restored server: %lld own messages it lost go back into the outbox with their cmids", qint64(rows.size()));
        emit ownMessagesRequeued(rows);
    }
}

void Sync::applied(const QString &conv, const QList<proto::Event> &events) {
    emit ownEventsStored(events);
    if (!events.isEmpty()) {
        emit eventsApplied(conv, events.first().seq, events.last().seq);
        notifyRecalls(conv, events);
    }
    emit timelineChanged(conv);
    emit conversationsChanged();
    emit ackDue(conv);
}

void Sync::loadOlder(const QString &conv, qint64 before, qint64 gapLo) {
    if (!conn_.isSessionUp() || id_.stale || older_.contains(conv)) {
        if (!older_.contains(conv))
            QMetaObject::invokeMethod(this, [this, conv] { emit windowLoaded(conv, false); }, Qt::QueuedConnection);
        return;
    }
    const std::optional<detail::ConvRow> row = storage_.conversation(conv);
    older_.insert(conv);
    const QString rid = conn_.nextRid();
    conn_.request(rid,
                   proto::encodeHistory(rid, conv, before, historyWindow,
                                        row && row->epoch > 0 ? std::optional<qint64>(row->epoch) : std::nullopt),
                   [this, conv, before, gapLo](const std::optional<proto::Incoming> &reply) {
                       onOlder(conv, before, gapLo, reply);
                   });
}

void Sync::onOlder(const QString &conv, qint64 before, qint64 gapLo, const std::optional<proto::Incoming> &reply) {
    older_.remove(conv);
    const proto::Disposition disp = proto::classify(reply);
    const auto *page = disp == proto::Disposition::Success ? std::get_if<proto::Page>(&reply->body) : nullptr;
    if (!page || !page->history || page->conv != conv) {
        if (disp == proto::Disposition::Terminal) {
            const QString code = proto::errorCode(reply);
            if (code == proto::code::EpochChanged || code == proto::code::CursorAhead)
                start(conv); // the forward sync meets the same verdict and resets
            else
                reporter_.report(code, proto::errorMessage(reply));
        }
        emit windowLoaded(conv, false);
        return;
    }
    bool stale = false;
    if (!storage_.applyWindow(*page, before, gapLo, &stale)) {
        reporter_.storageFailed(QStringLiteral("cannot apply history window"), storage_.lastError());
        emit windowLoaded(conv, false);
        return;
    }
    if (stale) { // the conversation was reset for another epoch meanwhile
        emit windowLoaded(conv, false);
        return;
    }
    qCInfo(lcSync, "%s: older window of %lld events below seq %lld loaded into the gap", qUtf8Printable(conv), qint64(page->events.size()), before);
    applied(conv, page->events);
    emit windowLoaded(conv, true);
}

void Sync::onSyncFailed(const QString &conv, const std::optional<proto::Incoming> &reply) {
    syncs_[conv].running = false;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = proto::errorCode(reply);
    if (disp == proto::Disposition::Retry) {
        release(conv);
        conn_.retryLater(QStringLiteral("sync:") + conv, [this, conv] { start(conv); });
        return;
    }
    if (disp == proto::Disposition::EndSession) {
        release(conv); // the next accepted session syncs again
        emit sessionMustEnd(reply);
        return;
    }
    if (code == proto::code::EpochChanged) {
        // Old cursors are void: drop local events and cursor, rebuild from 0.
        qCInfo(lcSync, "%s: EPOCH_CHANGED (%s): local events dropped, rebuilding from seq 0", qUtf8Printable(conv), qUtf8Printable(proto::errorMessage(reply)));
        if (!storage_.resetConversation(conv, true)) {
            reporter_.storageFailed(QStringLiteral("cannot reset conversation"), storage_.lastError());
            release(conv);
            return;
        }
        emit conversationReset(conv);
        emit timelineChanged(conv);
        emit conversationsChanged();
        start(conv);
    } else if (code == proto::code::CursorAhead) {
        qCInfo(lcSync, "%s: CURSOR_AHEAD: the cursor is past the server's head; cursor reset, syncing again", qUtf8Printable(conv));
        if (!storage_.resetConversation(conv, false)) {
            reporter_.storageFailed(QStringLiteral("cannot reset cursor"), storage_.lastError());
            release(conv);
            return;
        }
        emit conversationsChanged();
        start(conv);
    } else {
        release(conv);
        reporter_.report(code, proto::errorMessage(reply));
    }
}

void Sync::requestConvs(bool syncAfter) {
    if (!conn_.isSessionUp())
        return;
    if (syncAfter)
        syncAfterConvs_ = true;
    if (convsRunning_) {
        convsAgain_ = true; // one more walk once this one is done
        return;
    }
    convsRunning_ = true;
    ++walks_;
    lastWalk_.start();
    walkSyncs_ = std::exchange(syncAfterConvs_, false);
    qCDebug(lcSync, "convs walk%s", walkSyncs_ ? " (then sync what moved)" : "");
    requestConvsPage(QString());
}

void Sync::requestConvsPage(const QString &after) {
    const QString rid = conn_.nextRid();
    conn_.request(rid, proto::encodeConvs(rid, after, convsPageSize),
                   [this, after](const std::optional<proto::Incoming> &reply) {
                       convsAfter_ = after;
                       onConvs(reply);
                   });
}

void Sync::onConvs(const std::optional<proto::Incoming> &reply) {
    const proto::Disposition disp = proto::classify(reply);
    const auto endWalk = [this] {
        convsRunning_ = false;
        if (std::exchange(convsAgain_, false))
            requestConvs();
        else if (std::exchange(refreshAfterWalk_, false))
            scheduleConvsRefresh();
    };
    if (disp == proto::Disposition::Retry) {
        // Redo the walk from this page on (the pages before it are stored).
        const QString after = convsAfter_;
        conn_.retryLater(QStringLiteral("convs"), [this, after] { requestConvsPage(after); });
        return;
    }
    if (disp == proto::Disposition::Terminal || disp == proto::Disposition::EndSession) {
        if (disp == proto::Disposition::EndSession)
            emit sessionMustEnd(reply);
        else
            reporter_.report(proto::errorCode(reply), proto::errorMessage(reply));
        endWalk();
        return;
    }
    const auto *c = std::get_if<proto::Convs>(&reply->body);
    if (!c) {
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("convs answered without convs"));
        endWalk();
        return;
    }
    if (c->hasMore && c->nextAfter <= convsAfter_) {
        reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("convs page made no progress"));
        endWalk();
        return;
    }
    conn_.retrySucceeded(QStringLiteral("convs"));
    const std::optional<QHash<QString, detail::Cursor>> cursors = storage_.cursors();
    if (!cursors || !storage_.upsertConversations(c->convs)) {
        reporter_.storageFailed(QStringLiteral("cannot store conversation list"), storage_.lastError());
        endWalk();
        return;
    }
    emit conversationsChanged();
    for (const proto::ConvInfo &ci : c->convs) {
        const detail::Cursor cur = cursors->value(ci.conv);
        // A head below our cursor in the same epoch: the server was restored
        // and lost its tail. Every walk notices it, not only a push to that
        // conversation: the sync answers CURSOR_AHEAD and the conversation is
        // rebuilt (our own messages the server lost go back to the outbox).
        const bool restored = cur.epoch != 0 && ci.epoch == cur.epoch && ci.head < cur.after;
        // While walking to sync: only conversations whose head (or epoch)
        // moved past the stored cursor; an up-to-date one costs no request.
        const bool moved = walkSyncs_ && (cur.epoch == 0 || ci.head > cur.after || ci.epoch != cur.epoch);
        if (restored)
            qCInfo(lcSync, "%s: server head %lld below our cursor %lld (a restored server): rebuilding", qUtf8Printable(ci.conv), ci.head, cur.after);
        if (restored || moved)
            start(ci.conv);
    }
    if (c->hasMore)
        requestConvsPage(c->nextAfter);
    else
        endWalk();
}

void Sync::scheduleConvsRefresh() {
    if (!conn_.isSessionUp() || convsTimer_.isActive())
        return;
    // Coalesced (a burst of wishes, one walk), and never sooner than
    // convsMinIntervalMs after the last walk started, whatever asks for it.
    qint64 delay = 200;
    if (lastWalk_.isValid())
        delay = std::max(delay, qint64(convsMinIntervalMs) - lastWalk_.elapsed());
    convsTimer_.start(int(delay));
}

void Sync::notifyRecalls(const QString &conv, const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.kind != u"recall")
            continue;
        const QString cmid = storage_.cmidAt(conv, e.target);
        if (!cmid.isEmpty())
            emit messageStateChanged(conv, cmid, e.target, MessageState::Recalled, QString());
    }
}

void Sync::onEventPush(const proto::Event &ev) {
    if (!conn_.isSessionUp() || id_.stale)
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
    if (events.isEmpty() || !conn_.isSessionUp() || id_.stale)
        return;
    QList<bool> applied;
    if (!storage_.applyPushedEvents(events, &applied)) {
        reporter_.storageFailed(QStringLiteral("cannot apply pushed events"), storage_.lastError());
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
    emit ownEventsStored(done);
    for (const QString &conv : std::as_const(order)) {
        const QList<proto::Event> &evs = byConv.value(conv);
        emit eventsApplied(conv, evs.first().seq, evs.last().seq);
        notifyRecalls(conv, evs);
        emit timelineChanged(conv);
    }
    if (!done.isEmpty())
        emit conversationsChanged();
    for (const QString &conv : std::as_const(order))
        emit ackDue(conv);
    // Not the next seq (a gap, a reorder, or an unknown conversation): pull.
    for (const QString &conv : std::as_const(behind)) {
        qCDebug(lcSync, "%s: pushed event is not the next seq (gap, reorder or new conversation): pulling", qUtf8Printable(conv));
        if (!storage_.conversation(conv))
            scheduleConvsRefresh();
        start(conv);
    }
}

void Sync::onHint(const proto::Hint &h) {
    if (!conn_.isSessionUp() || id_.stale)
        return;
    std::optional<detail::ConvRow> row = storage_.conversation(h.conv);
    if (!row && !storage_.ensureConversation(h.conv)) {
        reporter_.storageFailed(QStringLiteral("cannot create conversation"), storage_.lastError());
        return;
    }
    // The hint's head and read move the badge without a walk: the sync it
    // starts counts what arrives above unread_head, and a read is counted
    // from the stored rows. The list is walked only for a conversation no
    // walk has listed yet (its kind, the server's count) or a read part of
    // the way that the stored rows cannot count (a gap, too long a range).
    bool serverCountNeeded = !row || row->kind.isEmpty();
    if (h.read) {
        bool uncounted = false;
        if (!storage_.setRead(h.conv, *h.read, &uncounted))
            reporter_.storageFailed(QStringLiteral("cannot record read marker"), storage_.lastError());
        serverCountNeeded = serverCountNeeded || uncounted;
        emit timelineChanged(h.conv);
    }
    if (!storage_.updateHead(h.conv, h.head))
        reporter_.storageFailed(QStringLiteral("cannot record head"), storage_.lastError());
    emit conversationsChanged();
    const qint64 after = row ? row->after : 0;
    // A head below the cursor (same epoch): a restored server; the sync
    // answers CURSOR_AHEAD and the conversation is rebuilt.
    const bool restored = row && row->epoch > 0 && h.epoch == row->epoch && h.head < after;
    if (h.head > after || restored || (row && row->epoch > 0 && h.epoch > 0 && h.epoch != row->epoch))
        start(h.conv);
    if (serverCountNeeded)
        scheduleConvsRefresh();
}

} // namespace im
