#include "outbox_p.h"

#include "connection_p.h"
#include "logging_p.h"
#include "outboxentry_p.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QDateTime>
#include <QtCore/QFile>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QUuid>

#include <algorithm>
#include <limits>

namespace im {

Outbox::Outbox(detail::Storage &storage, Connection &conn, detail::Reporter &reporter,
               const detail::Identity &identity, const detail::Backoff &retryBackoff)
    : storage_(storage), conn_(conn), reporter_(reporter), id_(identity), backoff_(retryBackoff),
      uploader_(storage, conn, reporter, retryBackoff, this) {
    clock_.start();
    retryTimer_.setSingleShot(true);
    retryTimer_.setTimerType(Qt::CoarseTimer);
    connect(&retryTimer_, &QTimer::timeout, this, &Outbox::pump);
    // Obligation 17: uploads run while a session is up (its token and user
    // are the ones the files' entries belong to); the next one starts when
    // the uploader is free.
    connect(&conn_, &Connection::sessionEnded, this, [this] { uploader_.stop(); });
    connect(&uploader_, &Uploader::idle, this, &Outbox::schedulePump);
    connect(&uploader_, &Uploader::completed, this, &Outbox::onUploaded);
    connect(&uploader_, &Uploader::failed, this, &Outbox::onUploadFailed);
    connect(&uploader_, &Uploader::attIdChanged, this, [this](const QString &cmid, const QString &attId) {
        const auto it = ids_.constFind(cmid);
        if (it != ids_.cend() && items_.at(*it).row.file)
            items_.at(*it).row.file->attId = attId;
    });
    connect(&uploader_, &Uploader::progress, this, [this](const QString &cmid, qint64 sent, qint64 total) {
        const auto it = ids_.constFind(cmid);
        if (it == ids_.cend())
            return;
        items_.at(*it).uploaded = sent;
        emit uploadProgress(cmid, sent, total);
    });
}

void Outbox::startUpload() {
    if (uploader_.busy() || !conn_.isSessionUp() || id_.stale)
        return;
    // The oldest file first (creation order): its message goes out first.
    for (auto &[id, item] : items_) {
        if (!item.uploading() || item.settling || item.held || !belongsToSession(item))
            continue;
        uploader_.start(item.row.cmid, *item.row.file);
        return;
    }
}

void Outbox::onUploaded(const QString &cmid, const QString &attId) {
    const auto it = ids_.constFind(cmid);
    if (it == ids_.cend() || !items_.at(*it).row.file)
        return;
    Item &item = items_.at(*it);
    item.row.file->attId = attId;
    item.row.file->complete = true;
    item.uploaded = item.row.file->size;
    emit entryChanged(item.row.id);
    schedulePump(); // the send (with its att_id) may go now
}

void Outbox::onUploadFailed(const QString &cmid, const QString &code, const QString &message) {
    const auto it = ids_.constFind(cmid);
    if (it == ids_.cend())
        return;
    Item &item = items_.at(*it);
    if (item.settling || item.inFlight)
        return;
    // A verdict like a terminal answer: the message fails, the next of its
    // conversation goes on (obligation 9).
    reporter_.report(code, QStringLiteral("%1: %2").arg(cmid, message));
    detail::Storage::Finish f;
    f.cmid = cmid;
    f.state = int(MessageState::Failed);
    f.errorCode = code;
    item.settling = true;
    finished_.append(f);
    scheduleFlush();
    schedulePump();
}

void Outbox::load(const QList<detail::OutboxRow> &rows) {
    for (const detail::OutboxRow &r : rows) {
        Item &loaded = items_.emplace(r.id, Item{r, false, false, {}, {}, 0}).first->second;
        loaded.markedAttempts = r.attempts;
        ids_.insert(r.cmid, r.id);
        convs_[r.conv].insert(r.id);
    }
    proven_.clear();
    for (auto &[id, item] : items_)
        item.held = computeHeld(item);
    emit entriesReset();
    noteHeld();
    schedulePump(); // uploads resume (from the server's offset) once a session is up
}

OutboxEntry Outbox::toEntry(const Item &item) {
    auto *e = new OutboxEntryData;
    e->cmid = item.row.cmid;
    e->conv = item.row.conv;
    e->kind = item.row.kind;
    e->body = item.row.body;
    e->target = item.row.target;
    e->attempts = item.row.attempts;
    e->lastError = item.row.lastError;
    if (item.row.nextRetryAt > 0)
        e->nextRetryAt = QDateTime::fromMSecsSinceEpoch(item.row.nextRetryAt);
    e->createdAt = QDateTime::fromMSecsSinceEpoch(item.row.createdAt);
    e->inFlight = item.inFlight;
    e->prev = item.sentPrev;
    e->held = item.held;
    e->replyTo = item.row.replyTo;
    e->emoji = item.row.emoji;
    e->on = item.row.on;
    e->targetCmid = item.row.targetCmid;
    return OutboxEntry(e);
}

void Outbox::clear() {
    items_.clear();
    ids_.clear();
    convs_.clear();
    finished_.clear();
    retries_.clear();
    inFlight_ = 0;
    proven_.clear();
    retryTimer_.stop();
    uploader_.stop();
    emit entriesReset();
    noteHeld();
}

QString Outbox::enqueue(const QString &kind, const QString &conv, const QString &body, qint64 target) {
    detail::OutboxRow row;
    row.kind = kind;
    row.conv = conv;
    row.body = body;
    row.target = target;
    return enqueue(std::move(row));
}

Outbox::Rewrite Outbox::rewriteUnsent(const QString &cmid, const QString &body) {
    const auto it = ids_.constFind(cmid);
    if (it == ids_.cend())
        return Rewrite::NotUnsent;
    Item &item = items_.at(*it);
    if (item.row.kind != u"send" || item.inFlight || item.settling || item.row.attempts > 0
        || item.markedAttempts > 0)
        return Rewrite::NotUnsent; // it may be on the server: the edit waits behind it instead
    if (!storage_.rewriteOutboxBody(cmid, body)) {
        reporter_.storageFailed(QStringLiteral("cannot rewrite outbox entry"), storage_.lastError());
        return Rewrite::Failed;
    }
    item.row.body = body;
    emit entryChanged(item.row.id);
    emit outboxChanged();
    emit timelineChanged(item.row.conv);
    emit draftWritten(item.row.conv);
    return Rewrite::Done;
}

void Outbox::showPendingChanges(const QString &conv, QList<detail::MessageRow> &rows) const {
    const auto c = convs_.constFind(conv);
    if (c == convs_.cend())
        return;
    for (const qint64 id : *c) {
        const Item &item = items_.at(id);
        const detail::OutboxRow &o = item.row;
        if (o.kind != u"edit" && o.kind != u"react")
            continue;
        for (detail::MessageRow &r : rows) {
            if (r.kind != u"msg" || !((o.target > 0 && r.seq == o.target) || (!o.targetCmid.isEmpty() && r.cmid == o.targetCmid)))
                continue;
            r.changePending = true;
            if (o.kind == u"edit") {
                r.body = o.body; // in creation order: the newest pending edit wins
                r.edited = true;
                break;
            }
            auto it = std::find_if(r.reactions.begin(), r.reactions.end(),
                                   [&](const proto::Reaction &x) { return x.emoji == o.emoji; });
            if (o.on && (it == r.reactions.end() || !it->me)) {
                if (it == r.reactions.end())
                    it = r.reactions.insert(r.reactions.end(), proto::Reaction{o.emoji, 0, false});
                ++it->count;
                it->me = true;
            } else if (!o.on && it != r.reactions.end() && it->me) {
                it->me = false;
                if (--it->count <= 0)
                    r.reactions.erase(it);
            }
            break;
        }
    }
}

Outbox::Target Outbox::resolveTarget(Item &item) {
    if (!isChange(item.row.kind) || item.row.target > 0)
        return Target::Ready;
    if (ids_.contains(item.row.targetCmid))
        return Target::Wait; // the target is still in the outbox (or its answer is being written)
    bool final = false;
    const qint64 seq = storage_.ownSeq(item.row.conv, item.row.targetCmid, &final);
    if (seq > 0) {
        item.row.target = seq;
        if (!storage_.resolveOutboxTarget(item.row.cmid, seq))
            reporter_.storageFailed(QStringLiteral("cannot record outbox target"), storage_.lastError());
        return Target::Ready; // (resolved again from the target's row after a restart)
    }
    if (!final)
        return Target::Wait;
    // The target failed or expired (or is unknown): it has no seq and never
    // will; the change fails as the server would answer it, without a request.
    qCInfo(lcOutbox, "%s in %s: its target %s has no seq and never will: NOT_FOUND", qUtf8Printable(item.row.cmid),
           qUtf8Printable(item.row.conv), qUtf8Printable(item.row.targetCmid));
    detail::Storage::Finish f;
    f.cmid = item.row.cmid;
    f.state = int(MessageState::Failed);
    f.errorCode = QStringLiteral("NOT_FOUND");
    item.settling = true;
    finished_.append(f);
    scheduleFlush();
    return Target::Failed;
}

QString Outbox::enqueue(detail::OutboxRow row) {
    if (!storage_.isOpen()) {
        reporter_.fail(QStringLiteral("INVALID_ARGUMENT"), QStringLiteral("database not open"),
                       QStringLiteral("database not open"));
        return {};
    }
    const QString conv = row.conv;
    if (row.cmid.isEmpty()) // (sendFile() chose it: its copy of the file is named after it)
        row.cmid = QUuid::createUuid().toString(QUuid::WithoutBraces); // UUID v4, random (A1)
    row.createdAt = QDateTime::currentMSecsSinceEpoch();
    // Obligation 10: bound to the credential it is written under, never to
    // the store's user: a JWT names its user offline; an opaque token is its
    // fingerprint until a welcome under it proved its user (then that user).
    row.owner = ownerOf(conn_.token());
    // One flush per send (issue 48): an entry the next pump() puts on the
    // wire carries its on-the-wire mark (attempts 1) in this transaction, so
    // pump() writes nothing for it. Otherwise it is marked when it leaves.
    Item added{row, false, false, {}, {}, 0};
    added.held = computeHeld(added);
    added.markedAttempts = goesOutAtOnce(added) ? 1 : 0;
    detail::OutboxRow stored = row;
    stored.attempts = added.markedAttempts;
    // A2: committed (WAL, synchronous=FULL) before anything is transmitted.
    row.id = storage_.enqueue(stored);
    if (row.id == 0) {
        reporter_.storageFailed(QStringLiteral("cannot write outbox"), storage_.lastError());
        return {};
    }
    added.row.id = row.id;
    items_.emplace(row.id, std::move(added));
    ids_.insert(row.cmid, row.id);
    convs_[conv].insert(row.id);
    emit entryAdded(row.id);
    noteHeld();
    emit messageStateChanged(conv, row.cmid, 0, MessageState::Pending, QString());
    emit outboxChanged();
    emit timelineChanged(conv);
    emit draftWritten(conv);
    schedulePump();
    return row.cmid;
}

QString Outbox::credentialOf(const QString &token) {
    if (token.isEmpty())
        return {};
    const QList<QStringView> parts = QStringView(token).split(u'.');
    if (parts.size() == 3) {
        const auto payload = QByteArray::fromBase64Encoding(
            parts.at(1).toLatin1(), QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals);
        if (payload) {
            const QJsonValue sub = QJsonDocument::fromJson(*payload).object().value(QLatin1String("sub"));
            if (sub.isString() && !sub.toString().isEmpty())
                return QStringLiteral("user:") + sub.toString();
        }
    }
    return QStringLiteral("token:")
        + QString::fromLatin1(QCryptographicHash::hash(token.toUtf8(), QCryptographicHash::Sha256).toHex());
}

QString Outbox::provenKey(const QString &credential) { return QStringLiteral("proven ") + credential; }

QString Outbox::ownerOf(const QString &token) const {
    const QString cred = credentialOf(token);
    if (!cred.startsWith(u"token:"))
        return cred; // a JWT's user, or no token
    auto it = proven_.constFind(cred);
    if (it == proven_.cend()) {
        // Proven by an earlier welcome (or handed over as the same user)?
        // Kept in the store's meta table, by fingerprint.
        const std::optional<QString> user = storage_.isOpen() ? storage_.meta(provenKey(cred)) : std::nullopt;
        it = proven_.insert(cred, user ? *user : QString());
    }
    return it->isEmpty() ? cred : QStringLiteral("user:") + *it;
}

bool Outbox::prove(const QString &credential, const QString &user) {
    if (!credential.startsWith(u"token:") || user.isEmpty())
        return true;
    if (proven_.value(credential) != user) {
        if (!storage_.setMeta(provenKey(credential), user))
            return false;
        proven_.insert(credential, user);
    }
    return rebind(credential, QStringLiteral("user:") + user);
}

bool Outbox::bindCredential(const QString &helloToken) {
    if (id_.userId.isEmpty())
        return true;
    return prove(credentialOf(helloToken), id_.userId);
}

bool Outbox::rebind(const QString &from, const QString &to) {
    bool any = false;
    for (const auto &[id, item] : items_)
        any = any || item.row.owner == from;
    if (any) {
        if (!storage_.rebindOutbox(from, to))
            return false;
        for (auto &[id, item] : items_)
            if (item.row.owner == from)
                item.row.owner = to;
    }
    updateHeld();
    return true;
}

bool Outbox::handOver(const QString &previous, const QString &next, bool sameUser) {
    const QString from = ownerOf(previous), to = ownerOf(next);
    if (!sameUser || from.isEmpty() || to.isEmpty() || from == to) {
        updateHeld(); // which drafts are held may depend on the current token
        return true;
    }
    if (from.startsWith(u"user:") && to.startsWith(u"user:")) {
        // Two JWTs naming different users: their `sub`s say otherwise.
        reporter_.lastError = QStringLiteral("the new token names user %1, the previous one %2: not the same user; "
                                             "drafts stay with the user they were written as")
                                  .arg(to.mid(5), from.mid(5));
        qCWarning(lcOutbox, "%s", qUtf8Printable(reporter_.lastError));
        updateHeld();
        return true;
    }
    if (from.startsWith(u"user:"))
        return prove(credentialOf(next), from.mid(5)); // the new opaque token is that user's
    // The previous opaque token was never proven: what it wrote goes with
    // the new token (and with its user once a welcome proves it).
    return rebind(from, to);
}

bool Outbox::belongsToSession(const Item &item) const {
    const QString &owner = item.row.owner;
    return owner.isEmpty() || (owner.startsWith(u"user:") && QStringView(owner).mid(5) == id_.userId);
}

bool Outbox::goesOutAtOnce(const Item &item) const {
    // (Entries of other conversations due in the same pump may fill the
    // window first: then the yes was wrong, and the entry waits marked.)
    if (!conn_.isSessionUp() || id_.stale || item.held || !belongsToSession(item) || inFlight_ >= window)
        return false;
    if (isChange(item.row.kind) && item.row.target <= 0)
        return false; // waits for its target's seq
    if (item.uploading())
        return false; // waits for its upload
    const bool recall = isChange(item.row.kind);
    int onWire = 0;
    const auto conv = convs_.constFind(item.row.conv);
    if (conv != convs_.cend()) {
        for (const qint64 id : *conv) {
            const Item &earlier = items_.at(id);
            if (earlier.settling || !belongsToSession(earlier))
                continue;
            if (!earlier.inFlight || isChange(earlier.row.kind))
                return false; // one waits ahead of it (its retry, or a recall's verdict)
            ++onWire;
        }
    }
    return onWire < std::max(1, window / 2) && !(recall && onWire > 0);
}

bool Outbox::computeHeld(const Item &item) const {
    const QString &owner = item.row.owner;
    if (owner.isEmpty())
        return false; // written before schema 4, or before any token: goes as before
    if (!id_.userId.isEmpty())
        return owner != QStringLiteral("user:") + id_.userId;
    // A store no welcome has named yet: the first welcome decides; what was
    // written under another token than the current one cannot be that session's.
    return owner != ownerOf(conn_.token());
}

void Outbox::updateHeld() {
    QSet<QString> convs;
    bool changed = false;
    for (auto &[id, item] : items_) {
        const bool held = computeHeld(item);
        if (held == item.held)
            continue;
        item.held = held;
        changed = true;
        convs.insert(item.row.conv);
        emit entryChanged(id);
    }
    if (!changed)
        return;
    for (const QString &conv : std::as_const(convs))
        emit timelineChanged(conv);
    noteHeld();
}

void Outbox::noteHeld() {
    const int n = heldCount();
    if (n == lastHeld_)
        return;
    lastHeld_ = n;
    emit heldChanged(n);
}

int Outbox::heldCount() const {
    int n = 0;
    for (const auto &[id, item] : items_)
        n += item.held ? 1 : 0;
    return n;
}

bool Outbox::isHeld(const QString &cmid) const {
    const auto it = ids_.constFind(cmid);
    return it != ids_.cend() && items_.at(*it).held;
}

int Outbox::discardHeld() {
    QList<qint64> held;
    for (const auto &[id, item] : items_)
        if (item.held && !item.inFlight && !item.settling)
            held.append(id);
    QSet<QString> convs;
    int n = 0;
    for (const qint64 id : std::as_const(held)) {
        const detail::OutboxRow &row = items_.at(id).row;
        if (!storage_.cancelOutbox(row.cmid)) {
            reporter_.storageFailed(QStringLiteral("cannot discard held draft"), storage_.lastError());
            n = -1;
            break;
        }
        convs.insert(row.conv);
        forget(id);
        ++n;
    }
    if (convs.isEmpty())
        return n;
    emit outboxChanged();
    for (const QString &conv : std::as_const(convs))
        emit timelineChanged(conv);
    noteHeld();
    return n;
}

void Outbox::resendPending() {
    // A new connection: each conversation's head is resent at once (what the
    // old connection committed comes back as dup).
    for (auto &[id, item] : items_)
        if (!item.inFlight)
            item.dueAt = 0;
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
    retryTimer_.stop();
    if (!conn_.isSessionUp() || id_.stale)
        return;
    startUpload();
    const qint64 t = now();
    qint64 nextDue = std::numeric_limits<qint64>::max();
    QList<QPair<Item *, QString>> batch; // entry, the `prev` it names
    int budget = window - inFlight_;
    // Obligation 9: each conversation in creation order, pipelined. A send
    // names the nearest earlier entry still on the wire as `prev`; the server
    // appends it only after that one is committed. Entries already answered
    // (settling) need no `prev`: committed, or final and never to be.
    // Fairness: one conversation takes at most half the window, and the walk
    // starts one conversation further on each time, so a backlog of
    // thousands in one conversation does not hold up a new message in another.
    const int perConv = std::max(1, window / 2);
    const QList<QString> convs = convs_.keys();
    const qsizetype start = convs.isEmpty() ? 0 : qsizetype(rotor_++ % quint64(convs.size()));
    for (qsizetype k = 0; k < convs.size() && budget > 0; ++k) {
        QString prev;
        int onWire = 0;
        for (const qint64 id : *convs_.constFind(convs.at((start + k) % convs.size()))) {
            Item &item = items_.at(id);
            const bool recall = isChange(item.row.kind); // recall, edit, react: alone
            if (item.settling || !belongsToSession(item))
                continue; // answered / another user's draft: never on this session
            if (item.inFlight) {
                if (recall)
                    break; // a recall on the wire: what follows waits for its verdict
                prev = item.row.cmid;
                ++onWire;
                continue;
            }
            if (item.dueAt > t) {
                nextDue = std::min(nextDue, item.dueAt);
                break; // waits for its retry; so does the rest
            }
            if (item.uploading())
                break; // its file is on its way (obligation 17); what follows waits behind it
            if (budget <= 0 || onWire >= perConv || (recall && !prev.isEmpty()))
                break; // the window is full / this conversation's share / a change waits for all before it
            if (recall) {
                const Target t = resolveTarget(item);
                if (t == Target::Wait)
                    break; // its target has no seq yet; what follows waits too
                if (t == Target::Failed)
                    continue; // failed without a request: the next may go
            }
            batch.append({&item, prev});
            --budget;
            ++onWire;
            if (recall)
                break;
            prev = item.row.cmid;
        }
    }
    if (nextDue != std::numeric_limits<qint64>::max())
        retryTimer_.start(int(std::min<qint64>(nextDue - t, std::numeric_limits<int>::max())));
    if (batch.isEmpty())
        return;
    // Obligation 3: the batch leaves in creation order across conversations
    // too (the walk above goes conversation by conversation); row ids are
    // creation order.
    std::stable_sort(batch.begin(), batch.end(),
                     [](const auto &a, const auto &b) { return a.first->row.id < b.first->row.id; });
    // Before any byte leaves: these entries count as sent from now on
    // (cancel() refuses them, also after a crash and restart).
    // An entry whose mark was written with it (enqueue) needs none here.
    QList<QPair<QString, int>> marks;
    marks.reserve(batch.size());
    for (const auto &[item, prev] : std::as_const(batch))
        if (item->row.attempts + 1 > item->markedAttempts)
            marks.append({item->row.cmid, item->row.attempts + 1});
    if (!storage_.markOnWire(marks)) {
        reporter_.storageFailed(QStringLiteral("cannot record outbox attempt"), storage_.lastError());
        for (const auto &[item, prev] : std::as_const(batch))
            item->dueAt = t + backoff_.delayMs(item->row.attempts + 1);
        schedulePump();
        return;
    }
    for (const auto &[item, prev] : std::as_const(batch)) {
        item->markedAttempts = std::max(item->markedAttempts, item->row.attempts + 1);
        transmit(*item, prev);
        emit entryChanged(item->row.id);
    }
    emit outboxChanged();
}

bool Outbox::cancel(const QString &cmid) {
    const auto it = ids_.constFind(cmid);
    if (it == ids_.cend()) {
        reporter_.lastError = QStringLiteral("%1 is not in the outbox").arg(cmid);
        return false;
    }
    const Item &item = items_.at(*it);
    if (item.inFlight || item.settling || item.row.attempts > 0) {
        // It may have been committed already: only recall() can undo it.
        reporter_.lastError = QStringLiteral("%1 was already sent; recall it once it is Sent").arg(cmid);
        return false;
    }
    if (!storage_.cancelOutbox(cmid)) {
        reporter_.storageFailed(QStringLiteral("cannot cancel outbox entry"), storage_.lastError());
        return false;
    }
    const QString conv = item.row.conv;
    if (item.row.file) {
        // Obligation 17: the upload goes too (the local copy in forget()).
        uploader_.stop(cmid);
        uploader_.remove(item.row.file->attId);
    }
    forget(*it);
    emit outboxChanged();
    emit timelineChanged(conv);
    noteHeld();
    return true;
}

void Outbox::transmit(Item &item, const QString &prev) {
    const QString rid = conn_.nextRid();
    const detail::OutboxRow &r = item.row;
    const QByteArray frame = r.kind == u"recall" ? proto::encodeRecall(rid, r.conv, r.target, r.cmid)
                             : r.kind == u"edit" ? proto::encodeEdit(rid, r.conv, r.target, r.cmid, r.body)
                             : r.kind == u"react"
                                 ? proto::encodeReact(rid, r.conv, r.target, r.cmid, r.emoji, r.on)
                                 : proto::encodeSend(rid, r.conv, r.cmid, r.body, prev, r.replyTo,
                                                     r.file ? QStringList{r.file->attId} : QStringList{});
    ++item.row.attempts;
    item.inFlight = true;
    item.rid = rid;
    item.sentPrev = prev;
    ++inFlight_;
    const QString cmid = item.row.cmid;
    conn_.request(
        rid, frame, [this, rid, cmid](const std::optional<proto::Incoming> &reply) { onOutcome(rid, cmid, reply); },
        Connection::Kind::Outbox);
}

void Outbox::retry(Item &item, const QString &lastError, qint64 waitMs) {
    item.inFlight = false;
    --inFlight_;
    item.row.lastError = lastError;
    // Sent behind an unanswered `prev`: most likely refused because that one
    // was not committed yet. Due at once: the walk in pump() keeps it behind
    // its predecessors, so it goes again right after them (and without a
    // `prev` if they are answered by then). Only an entry that went with no
    // `prev` waits out a back-off.
    // RATE_LIMITED: the server's retry_ms, whatever the rest says (sdk.md
    // obligation 2; the same cmid goes again, so the resend is safe).
    const int delay = waitMs > 0 ? int(waitMs)
                                 : item.sentPrev.isEmpty() ? backoff_.delayMs(item.row.attempts) : 0;
    item.dueAt = now() + delay;
    qCDebug(lcOutbox, "%s (attempt %d): %s, retry in %d ms; %s waits behind it", qUtf8Printable(item.row.cmid),
            item.row.attempts, qUtf8Printable(lastError), delay, qUtf8Printable(item.row.conv));
    item.row.nextRetryAt = QDateTime::currentMSecsSinceEpoch() + delay; // for display only
    retries_.append({item.row.cmid, item.row.attempts, item.row.lastError, item.row.nextRetryAt});
    emit entryChanged(item.row.id);
    scheduleFlush();
    schedulePump(); // arms the retry timer
}

void Outbox::onOutcome(const QString &rid, const QString &cmid, const std::optional<proto::Incoming> &reply) {
    const auto idIt = ids_.constFind(cmid);
    if (idIt == ids_.cend())
        return; // already final (e.g. a late duplicate reply)
    Item &item = items_.at(*idIt);
    if (item.settling)
        return; // already answered
    const bool current = item.inFlight && item.rid == rid;
    const proto::Disposition disp = proto::classify(reply);
    const QString code = proto::errorCode(reply);

    if (disp == proto::Disposition::Retry) {
        if (!current)
            return; // an older attempt; a newer one is on the wire
        retry(item,
              !code.isEmpty()            ? code
              : conn_.isSessionUp() ? QStringLiteral("TIMEOUT")
                                    : QStringLiteral("DISCONNECTED"),
              proto::retryAfterMs(reply));
        emit outboxChanged();
        return;
    }
    if (disp == proto::Disposition::EndSession) {
        // Not a verdict on the message (the token is no longer accepted, or
        // the install is stale) and the server wrote nothing: the entry stays
        // Pending for the next accepted session, and this one ends.
        if (current)
            retry(item, code);
        emit outboxChanged();
        emit sessionMustEnd(reply);
        return;
    }

    detail::Storage::Finish f;
    f.cmid = cmid;
    f.state = int(MessageState::Sent);
    if (disp == proto::Disposition::Success) {
        if (const auto *s = std::get_if<proto::Sent>(&reply->body)) {
            f.seq = s->seq;
            f.dup = s->dup;
            f.epoch = s->epoch;
        } else if (const auto *r = std::get_if<proto::Recalled>(&reply->body)) {
            f.seq = r->seq;
            f.dup = r->dup;
        } else if (const auto *ed = std::get_if<proto::Edited>(&reply->body)) {
            f.seq = ed->seq;
            f.dup = ed->dup;
            f.epoch = ed->epoch;
        } else if (const auto *rc = std::get_if<proto::Reacted>(&reply->body)) {
            f.seq = rc->seq; // 0: an on:false that found nothing (nothing to undo)
            f.dup = rc->dup;
            f.epoch = rc->epoch;
        } else {
            // A success frame of the wrong type: treat as no reply.
            reporter_.report(QStringLiteral("PROTOCOL_ERROR"), QStringLiteral("unexpected reply to an outbox request"));
            if (current)
                retry(item, QStringLiteral("PROTOCOL_ERROR"));
            return;
        }
    } else {
        // A4: ORIGINAL_EXPIRED means "sent once, purged": Expired, never resent.
        f.state = int(code == proto::code::OriginalExpired ? MessageState::Expired : MessageState::Failed);
        f.errorCode = code;
        qCInfo(lcOutbox, "%s in %s: final answer %s", qUtf8Printable(cmid), qUtf8Printable(item.row.conv),
               qUtf8Printable(code));
    }
    if (item.inFlight) {
        item.inFlight = false;
        --inFlight_;
        emit entryChanged(item.row.id);
    }
    // A verdict (committed, or a terminal error) frees the conversation's
    // next entry at once: a terminal error does not hold up what follows.
    item.settling = true;
    finished_.append(f);
    scheduleFlush();
    schedulePump();
}

void Outbox::scheduleFlush() {
    if (flushQueued_)
        return;
    flushQueued_ = true;
    QMetaObject::invokeMethod(this, [this] {
        flushQueued_ = false;
        flush();
    }, Qt::QueuedConnection);
}

void Outbox::forget(qint64 id) {
    const auto it = items_.find(id);
    if (it == items_.end())
        return;
    emit entryAboutToBeRemoved(id);
    if (it->second.row.file) {
        // Its outbox rows are gone (committed): so goes the store's copy
        // of its file (obligation 17). A copy left by a crash right here is
        // removed by the next open() (Client::open).
        uploader_.stop(it->second.row.cmid);
        QFile::remove(storage_.outgoingFilePath(it->second.row.cmid));
    }
    ids_.remove(it->second.row.cmid);
    auto c = convs_.find(it->second.row.conv);
    if (c != convs_.end()) {
        c->erase(id);
        if (c->empty())
            convs_.erase(c);
    }
    items_.erase(it);
}

void Outbox::flush() {
    if (finished_.isEmpty() && retries_.isEmpty())
        return;
    const QList<detail::Storage::Finish> finished = std::exchange(finished_, {});
    const QList<detail::Storage::Retry> retries = std::exchange(retries_, {});
    if (!storage_.isOpen())
        return;
    if (!storage_.settleOutbox(finished, retries)) {
        // Keep the entries: a resend gets the same answer (dup) and we try again.
        reporter_.storageFailed(QStringLiteral("cannot record outbox answers"), storage_.lastError());
        for (const detail::Storage::Finish &f : finished) {
            const auto it = ids_.constFind(f.cmid);
            if (it == ids_.cend())
                continue;
            Item &item = items_.at(*it);
            item.settling = false;
            item.dueAt = now() + backoff_.delayMs(item.row.attempts);
        }
        schedulePump();
        return;
    }
    QSet<QString> convs;
    for (const detail::Storage::Finish &f : finished) {
        const auto it = ids_.constFind(f.cmid);
        if (it == ids_.cend())
            continue;
        const QString conv = items_.at(*it).row.conv;
        forget(*it);
        convs.insert(conv);
        emit messageStateChanged(conv, f.cmid, f.seq, MessageState(f.state), f.errorCode);
    }
    emit outboxChanged();
    for (const QString &conv : std::as_const(convs))
        emit timelineChanged(conv);
    schedulePump(); // a change waiting for one of these targets may go now
}

void Outbox::settleOwnEvents(const QList<proto::Event> &events) {
    for (const proto::Event &e : events) {
        if (e.cmid.isEmpty() || e.sender != id_.userId || !ids_.contains(e.cmid))
            continue;
        // The committed event is the answer: seq and mid are permanent.
        proto::Incoming settled;
        if (e.kind == u"recall")
            settled.body = proto::Recalled{e.conv, e.seq, false};
        else if (e.kind == u"msg")
            settled.body = proto::Sent{e.conv, e.seq, e.mid, false, e.epoch};
        else if (e.kind == u"edit")
            settled.body = proto::Edited{e.conv, e.seq, false, e.epoch};
        else if (e.kind == u"reaction")
            settled.body = proto::Reacted{e.conv, e.seq, false, true, e.epoch};
        else
            continue;
        onOutcome(QString(), e.cmid, settled);
    }
}

} // namespace im
