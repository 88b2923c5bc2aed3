#include "client_p.h"
#include "logging_p.h"

#include <im/presencewatch.h>

#include <QtNetwork/QSslCertificate>

#include <QtCore/QEvent>
#include <QtCore/QRandomGenerator>
#include <QtCore/QUuid>

#include <algorithm>
#include <initializer_list>
#include <utility>

namespace im {
namespace {

const QString StorageError = QStringLiteral("STORAGE_ERROR");

} // namespace

// ---------------------------------------------------------------------------
// FaultHooks: the QA hooks, reached by im::testing::Faults by name.

FaultHooks::FaultHooks(Connection &conn, Uploader &uploader, QObject *parent)
    : QObject(parent), conn_(conn), uploader_(uploader) {
    setObjectName(QStringLiteral("im.sdk.faults"));
    connect(&conn_, &Connection::offlineChanged, this, &FaultHooks::offlineChanged);
    connect(&conn_, &Connection::replyDropped, this, &FaultHooks::replyDropped);
    connect(&uploader_, &Uploader::chunkCorrupted, this, &FaultHooks::uploadChunkCorrupted);
}
bool FaultHooks::isOffline() const { return conn_.isOffline(); }
void FaultHooks::setOffline(bool offline) { conn_.setOffline(offline); }
void FaultHooks::dropNextReply() { conn_.dropNextReply(); }
void FaultHooks::closeSocketNow() { conn_.closeSocketNow(); }
void FaultHooks::corruptNextUploadChunk() { uploader_.corruptNextChunk(); }

// ---------------------------------------------------------------------------
// ClientPrivate: what the parts share, and the session's start wired to them.

ClientPrivate::ClientPrivate(Client *qq)
    : QObject(qq), q(qq), conn(*this, reporter, retryBackoff), outbox(storage, conn, reporter, id, retryBackoff),
      sync(storage, conn, reporter, id), markers(storage, conn, reporter), ephemeral(conn) {
    // Everything the client is made of is in its object tree (this object
    // is a child of the Client; the parts, their timers and the transport's
    // socket are children below it), so client->moveToThread() takes all of
    // it along (issue 48). Members as children are safe: each one leaves its
    // parent's list when it is destroyed, before ~QObject of its parent.
    for (QObject *part : std::initializer_list<QObject *>{&reporter, &conn, &outbox, &sync, &markers, &ephemeral, &indexBuild})
        part->setParent(this);
    indexBuild.setInterval(0);
    connect(&indexBuild, &QTimer::timeout, this, &ClientPrivate::buildIndexStep);
    faultHooks = new FaultHooks(conn, outbox.uploader(), q);
    setUpDownloads();
    // Every part's report, typed: one place.
    connect(&reporter, &detail::Reporter::errorOccurred, this, &ClientPrivate::reportError);

    // The session's start and end, to the parts.
    connect(&conn, &Connection::sessionStarted, this, &ClientPrivate::onSessionStarted);
    connect(&conn, &Connection::sessionEnded, this, [this] {
        sync.sessionEnded();
        markers.sessionEnded();
        ephemeral.sessionEnded();
    });
    connect(&conn, &Connection::staleInstall, this, &ClientPrivate::enterStale);
    // Pushes to Sync; what Sync stored to Outbox (our own events settle
    // their entries, first) and Markers (an ack is due); Markers' wish for
    // a fresh conversation list to Sync.
    connect(&conn, &Connection::eventPushed, &sync, &Sync::onEventPush);
    connect(&conn, &Connection::hintPushed, &sync, &Sync::onHint);
    connect(&conn, &Connection::resyncPushed, &sync, &Sync::onResync);
    // Typing and presence (contract 13): pushes to Ephemeral; a pushed
    // message from a typist ends their typing; a resync asks presence again.
    connect(&conn, &Connection::typingPushed, &ephemeral, &Ephemeral::onTypingPush);
    connect(&conn, &Connection::presencePushed, &ephemeral, &Ephemeral::onPresencePush);
    connect(&conn, &Connection::eventPushed, &ephemeral, &Ephemeral::onEvent);
    connect(&conn, &Connection::resyncPushed, &ephemeral, &Ephemeral::onResync);
    connect(&ephemeral, &Ephemeral::typingChanged, this, &ClientPrivate::typingChanged);
    connect(this, &ClientPrivate::typingChanged, q, &Client::typingChanged);
    connect(&sync, &Sync::ownEventsStored, &outbox, &Outbox::settleOwnEvents);
    connect(&sync, &Sync::ackDue, &markers, &Markers::sendAck);
    // Our own messages a restored server lost, back in the outbox table:
    // the outbox takes them (creation order among them) and sends them with
    // their cmid; each shows as Pending until its new seq comes.
    connect(&sync, &Sync::ownMessagesRequeued, this, [this](const QList<detail::OutboxRow> &rows) {
        outbox.load(rows);
        for (const detail::OutboxRow &r : rows)
            emit q->messageStateChanged(r.conv, r.cmid, 0, MessageState::Pending, QString());
        emit q->outboxChanged();
        outbox.schedulePump();
    });
    connect(&markers, &Markers::convsRefreshWanted, &sync, [this] { sync.scheduleConvsRefresh(); });
    connect(&outbox, &Outbox::sessionMustEnd, this, &ClientPrivate::endSession);
    connect(&sync, &Sync::sessionMustEnd, this, &ClientPrivate::endSession);
    connect(&markers, &Markers::sessionMustEnd, this, &ClientPrivate::endSession);

    // What the models follow: private signals of this object (see below).
    connect(&outbox, &Outbox::timelineChanged, this, &ClientPrivate::timelineChanged);
    connect(&outbox, &Outbox::draftWritten, this, &ClientPrivate::draftWritten);
    connect(&sync, &Sync::timelineChanged, this, &ClientPrivate::timelineChanged);
    connect(&markers, &Markers::timelineChanged, this, &ClientPrivate::timelineChanged);
    connect(&sync, &Sync::conversationsChanged, this, &ClientPrivate::conversationsChanged);
    connect(&markers, &Markers::conversationsChanged, this, &ClientPrivate::conversationsChanged);

    // The public signals. Those the models also follow are emitted by this
    // private object: the models listen to it, never to the Client, so an
    // app's client->disconnect() (all of the Client's connections) leaves
    // them working (issue 26 item 9).
    connect(this, &ClientPrivate::conversationsChanged, q, &Client::conversationsChanged);
    connect(this, &ClientPrivate::identityChanged, q, &Client::identityChanged);
    connect(&conn, &Connection::stateChanged, q, &Client::connectionStateChanged);
    connect(&conn, &Connection::awaitingCredentialsChanged, q, &Client::awaitingCredentialsChanged);
    connect(&conn, &Connection::credentialsNeeded, q,
            [this](int reason) { emit q->credentialsNeeded(Client::CredentialsReason(reason)); });
    connect(&conn, &Connection::tokenExpiryChanged, q, &Client::tokenExpiresAtChanged);
    connect(&outbox, &Outbox::messageStateChanged, q, &Client::messageStateChanged);
    connect(&sync, &Sync::messageStateChanged, q, &Client::messageStateChanged);
    connect(&outbox, &Outbox::outboxChanged, q, &Client::outboxChanged);
    connect(&outbox, &Outbox::heldChanged, q, &Client::heldDraftsChanged);
    connect(&outbox, &Outbox::uploadProgress, q, &Client::uploadProgress);
    connect(&sync, &Sync::eventsApplied, q, &Client::eventsApplied);
    connect(&sync, &Sync::conversationReset, q, &Client::conversationReset);
    connect(&sync, &Sync::conversationSynced, q, &Client::conversationSynced);
}

ClientPrivate::~ClientPrivate() { delete faultHooks; }

bool ClientPrivate::event(QEvent *e) {
    // The store's SQLite connection belongs to the thread that opened it
    // (Qt Sql): a client moved while its store is open cannot use it on the
    // new thread. Say so where it happens (docs/sdk.md, "Threads").
    if (e->type() == QEvent::ThreadChange && storage.isOpen())
        qCWarning(lcClient, "a Client was moved to another thread with its store open (%s): its database calls "
                            "will fail there; moveToThread() before open(), or close() and open() it again on "
                            "the new thread",
                  qUtf8Printable(storage.path()));
    return QObject::event(e);
}

void ClientPrivate::onSessionStarted(const QString &helloToken) {
    sync.requestConvs(true);
    markers.sendPendingReads();
    // The welcome proves the token the hello carried, not whatever token the
    // app handed over during the handshake (issue 48).
    if (!outbox.bindCredential(helloToken))
        storageFailed(QStringLiteral("cannot bind drafts to their user"));
    outbox.updateHeld();
    if (const int held = outbox.heldCount(); held > 0)
        reportError(QStringLiteral("DRAFTS_HELD"),
                              QStringLiteral("%1 outbox entries were written under another user's credential; "
                                             "they are held, never sent as %2 (cancel() them, or open the store "
                                             "with that user's token)")
                                  .arg(held)
                                  .arg(id.userId));
    outbox.resendPending();
    ephemeral.sessionStarted();
}

void ClientPrivate::reportError(const QString &code, const QString &message) {
    // Every report, typed too: one place, whichever part raised it.
    qCWarning(lcClient, "%s: %s", qUtf8Printable(code), qUtf8Printable(message));
    emit q->errorOccurred(code, message);
    emit q->errorReported(errorFromCode(code), code, message);
}

void ClientPrivate::storageFailed(const QString &what) {
    reporter.lastError = QStringLiteral("%1: %2").arg(what, storage.lastError());
    reportError(StorageError, reporter.lastError);
}

bool ClientPrivate::acceptIdentity(const QString &user, const QString &device) {
    if (user == id.userId && device == id.deviceId)
        return true;
    if (!id.userId.isEmpty() && user != id.userId) {
        // Obligation 10: the store belongs to the user of its first welcome.
        // Nothing of this store is sent as another user, nothing of theirs
        // is stored or shown: refuse the session for good (no reconnect).
        reporter.lastError = QStringLiteral("this store belongs to user %1, but the server accepted the token as user %2; "
                                   "open another store for %2")
                        .arg(id.userId, user);
        conn.refuse(QStringLiteral("WRONG_USER"), reporter.lastError);
        return false;
    }
    if (!storage.setMeta(QStringLiteral("user"), user) || !storage.setMeta(QStringLiteral("device"), device)) {
        storageFailed(QStringLiteral("cannot record identity"));
        return false;
    }
    id.userId = user;
    id.deviceId = device;
    emit identityChanged();
    return true;
}

void ClientPrivate::endSession(const std::optional<proto::Incoming> &reply) {
    if (proto::errorCode(reply) == proto::code::StaleInstall)
        enterStale(proto::errorMessage(reply));
    else
        qCInfo(lcClient, "%s: the session ends; entries wait for the next one", qUtf8Printable(proto::errorCode(reply)));
}

void ClientPrivate::enterStale(const QString &message) {
    const bool was = id.stale;
    id.stale = true;
    reporter.lastError = QStringLiteral("STALE_INSTALL: %1").arg(message);
    if (!storage.setMeta(QStringLiteral("install_stale"), QStringLiteral("1")))
        storageFailed(QStringLiteral("cannot record stale install"));
    conn.transport()->stop();
    conn.setState(ConnectionState::Disconnected);
    if (!was) {
        emit q->installStaleChanged(true);
        reportError(QString::fromUtf16(proto::code::StaleInstall), message);
    }
}

// ---------------------------------------------------------------------------
// Client

Client::Client(QObject *parent) : QObject(parent), d(std::make_unique<ClientPrivate>(this)) {}

Client::~Client() {
    emit d->aboutToBeDestroyed(); // the models let go of this client
    d->conn.transport()->stop();
}

void Client::setServers(const QList<QUrl> &servers) {
    const bool changed = d->conn.urls != servers;
    d->conn.urls = servers;
    d->conn.transport()->setUrls(servers);
    if (changed)
        emit settingsChanged();
}
QList<QUrl> Client::servers() const { return d->conn.urls; }
bool Client::setTrustedCaFile(const QString &pemFile) {
    QList<QSslCertificate> cas;
    if (!pemFile.isEmpty()) {
        cas = QSslCertificate::fromPath(pemFile, QSsl::Pem, QSslCertificate::PatternSyntax::FixedString);
        if (cas.isEmpty()) {
            d->reporter.lastError = QStringLiteral("no PEM certificate in %1").arg(pemFile);
            return false;
        }
    }
    d->conn.transport()->setTrustedCas(cas);
    if (d->trustedCaFile != pemFile) {
        d->trustedCaFile = pemFile;
        emit settingsChanged();
    }
    return true;
}
QString Client::trustedCaFile() const { return d->trustedCaFile; }
void Client::setTrustedCaFileProperty(const QString &pemFile) {
    if (!setTrustedCaFile(pemFile))
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
}
bool Client::setPinnedCertificateSha256(const QString &fingerprint) {
    QString hex = fingerprint.trimmed();
    hex.remove(QLatin1Char(':'));
    const QByteArray digest = QByteArray::fromHex(hex.toLatin1());
    if (!hex.isEmpty() && (hex.size() != 64 || digest.size() != 32 || digest.toHex().compare(hex.toLatin1(), Qt::CaseInsensitive) != 0)) {
        d->reporter.lastError = QStringLiteral("not a SHA-256 fingerprint (64 hex digits): %1").arg(fingerprint);
        return false;
    }
    d->conn.transport()->setPinnedSha256(digest);
    if (d->pinnedSha256 != fingerprint) {
        d->pinnedSha256 = fingerprint;
        emit settingsChanged();
    }
    return true;
}
QString Client::pinnedCertificateSha256() const { return d->pinnedSha256; }
void Client::setPinnedCertificateSha256Property(const QString &fingerprint) {
    if (!setPinnedCertificateSha256(fingerprint))
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
}
void Client::setCredentials(const QString &token) { setCredentials(token, UnknownUser); }

void Client::setCredentials(const QString &token, TokenOwner owner) {
    // Obligation 10 (issue 48): drafts stay with the credential they were
    // written under, also after a rejection (ana's revoked token, then ben
    // signs in on the same machine), unless the app says the new token is
    // the same person's as the one it replaces.
    const QString previous = d->conn.token();
    d->conn.setToken(token);
    if (d->storage.isOpen() && !d->outbox.handOver(previous, token, owner == SameUser))
        d->storageFailed(QStringLiteral("cannot move drafts to the new token"));
}
QDateTime Client::tokenExpiresAt() const { return d->conn.tokenExpiresAt(); }
bool Client::isAwaitingCredentials() const { return d->conn.awaitsCredentials(); }

void Client::setRequestTimeout(int ms) {
    ms = std::max(1, ms);
    if (ms == d->conn.requestTimeoutMs)
        return;
    d->conn.requestTimeoutMs = ms;
    emit requestTimeoutChanged(ms);
}
int Client::requestTimeout() const { return d->conn.requestTimeoutMs; }

// Each setting: the setter clamps, and settingsChanged() follows a change.
void Client::setRetryBackoff(int initialMs, int maxMs) {
    const detail::Backoff was = d->retryBackoff;
    d->retryBackoff.initialMs = std::max(1, initialMs);
    d->retryBackoff.maxMs = std::max(d->retryBackoff.initialMs, maxMs);
    if (was.initialMs != d->retryBackoff.initialMs || was.maxMs != d->retryBackoff.maxMs)
        emit settingsChanged();
}
int Client::retryBackoffInitial() const { return d->retryBackoff.initialMs; }
int Client::retryBackoffMax() const { return d->retryBackoff.maxMs; }
void Client::setRetryBackoffInitial(int ms) { setRetryBackoff(ms, std::max(ms, retryBackoffMax())); }
void Client::setRetryBackoffMax(int ms) { setRetryBackoff(std::min(retryBackoffInitial(), std::max(1, ms)), ms); }
void Client::setReconnectBackoff(int initialMs, int maxMs) {
    const int initial = reconnectBackoffInitial(), max = reconnectBackoffMax();
    d->conn.transport()->setBackoff(initialMs, maxMs);
    if (initial != reconnectBackoffInitial() || max != reconnectBackoffMax())
        emit settingsChanged();
}
int Client::reconnectBackoffInitial() const { return d->conn.transport()->initialBackoffMs(); }
int Client::reconnectBackoffMax() const { return d->conn.transport()->maxBackoffMs(); }
void Client::setReconnectBackoffInitial(int ms) { setReconnectBackoff(ms, std::max(ms, reconnectBackoffMax())); }
void Client::setReconnectBackoffMax(int ms) {
    setReconnectBackoff(std::min(reconnectBackoffInitial(), std::max(1, ms)), ms);
}
void Client::setSyncPageSize(int limit) {
    limit = std::clamp(limit, 1, 200);
    if (std::exchange(d->sync.pageSize, limit) != limit)
        emit settingsChanged();
}
int Client::syncPageSize() const { return d->sync.pageSize; }
void Client::setHistoryWindow(int events) {
    events = std::clamp(events, 1, 200);
    if (std::exchange(d->sync.historyWindow, events) != events)
        emit settingsChanged();
}
int Client::historyWindow() const { return d->sync.historyWindow; }
void Client::setBacklogLimit(int events) {
    if (std::exchange(d->sync.backlogLimit, events) != events)
        emit settingsChanged();
}
int Client::backlogLimit() const { return d->sync.backlogLimit; }
void Client::setKeepAlive(int pingIntervalMs, int silenceTimeoutMs) {
    const int ping = pingInterval(), silence = silenceTimeout();
    d->conn.setKeepAlive(pingIntervalMs, silenceTimeoutMs);
    if (ping != pingInterval() || silence != silenceTimeout())
        emit settingsChanged();
}
int Client::pingInterval() const { return d->conn.pingIntervalMs(); }
int Client::silenceTimeout() const { return d->conn.silenceTimeoutMs(); }
// One half at a time, whatever the order (QML sets properties in any
// order): the other half keeps the value it was set to.
void Client::setPingInterval(int ms) { setKeepAlive(ms, d->conn.silenceSettingMs()); }
void Client::setSilenceTimeout(int ms) { setKeepAlive(pingInterval(), ms); }
void Client::setSendWindow(int requests) {
    requests = std::max(1, requests);
    if (requests == d->outbox.window)
        return;
    d->outbox.window = requests;
    d->outbox.schedulePump(); // a wider window may let more go now
    emit settingsChanged();
}
int Client::sendWindow() const { return d->outbox.window; }

bool Client::open(const QString &databasePath) {
    close();
    if (!d->storage.open(databasePath)) {
        d->reporter.lastError = d->storage.lastError();
        d->reportError(d->storage.lockedByOther() ? QStringLiteral("STORE_LOCKED") : StorageError, d->reporter.lastError);
        return false;
    }
    auto fail = [this](const QString &what) {
        d->reporter.lastError = QStringLiteral("%1: %2").arg(what, d->storage.lastError());
        d->storage.close();
        d->reportError(StorageError, d->reporter.lastError);
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
    d->id.installId = *install;
    d->id.userId = *user;
    d->id.deviceId = *device;
    const bool wasStale = d->id.stale;
    d->id.stale = *staleFlag == u"1";
    d->outbox.load(*rows);
    d->removeOrphanCopies();
    emit installIdChanged();
    emit d->identityChanged();
    if (wasStale != d->id.stale)
        emit installStaleChanged(d->id.stale);
    emit outboxChanged();
    emit d->conversationsChanged();
    d->startIndexBuild();
    return true;
}

bool Client::isOpen() const { return d->storage.isOpen(); }

void Client::close() {
    if (!d->storage.isOpen())
        return;
    disconnectFromServer();
    d->outbox.clear();
    d->sync.clear();
    d->fetchedQuotes.clear(); // another store may be another user's (obligation 10)
    d->quotesAsked.clear();
    d->search.reset(); // ends the search thread and its connection
    d->indexBuild.stop();
    d->downloads->stopAll(); // their partial files stay for the next open()
    d->storage.close();
    emit outboxChanged();
    emit d->conversationsChanged();
}

QString Client::databasePath() const { return d->storage.path(); }
QString Client::lastError() const { return d->reporter.lastError; }
ConnectionState Client::connectionState() const { return d->conn.state(); }
QString Client::gatewayId() const { return d->conn.gateway(); }
QUrl Client::currentServer() const { return d->conn.transport()->currentUrl(); }
QDateTime Client::nextReconnectAt() const {
    return d->conn.state() == ConnectionState::Reconnecting ? d->conn.transport()->nextAttemptAt() : QDateTime();
}
QString Client::userId() const { return d->id.userId; }
QString Client::deviceId() const { return d->id.deviceId; }
QString Client::installId() const { return d->id.installId; }
bool Client::isInstallStale() const { return d->id.stale; }
int Client::pendingCount() const { return d->outbox.size(); }
int Client::heldCount() const { return d->outbox.heldCount(); }
bool Client::isHeld(const QString &cmid) const { return d->outbox.isHeld(cmid); }

int Client::discardHeldDrafts() {
    if (!d->storage.isOpen())
        return 0;
    return d->outbox.discardHeld();
}

QList<OutboxEntry> Client::outbox() const {
    QList<OutboxEntry> out;
    out.reserve(d->outbox.size());
    for (const auto &[id, item] : d->outbox.items())
        out.append(Outbox::toEntry(item));
    return out;
}

MessageState Client::messageState(const QString &cmid) const {
    if (d->outbox.contains(cmid) || !d->storage.isOpen())
        return MessageState::Pending;
    const std::optional<detail::LocalMessage> m = d->storage.localMessage(cmid);
    if (!m)
        return MessageState::Pending;
    // A sent message shows Recalled once its recall is stored: the state
    // messages() gives its row, found by a point lookup (one message, not
    // the timeline from it on).
    if (m->kind == u"send" && m->seq > 0 && MessageState(m->state) == MessageState::Sent
        && !d->storage.cmidAt(m->conv, m->seq).isEmpty()
        && d->storage.ownEventRecalled(m->conv, m->seq, cmid, d->id.userId))
        return MessageState::Recalled;
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
        d->reporter.lastError = QStringLiteral("open() the database first");
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
        return;
    }
    if (d->id.stale) {
        d->reporter.lastError = QStringLiteral("install is stale; call resetInstall()");
        d->reportError(QString::fromUtf16(proto::code::StaleInstall), d->reporter.lastError);
        return;
    }
    d->conn.start();
}

void Client::disconnectFromServer() {
    d->conn.stop();
}

QString Client::send(const QString &conv, const QString &body) {
    if (const QString why = proto::checkSend(conv, body); !why.isEmpty()) {
        d->reporter.lastError = QStringLiteral("send refused: %1").arg(why);
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
        return {};
    }
    const QString cmid = d->outbox.enqueue(QStringLiteral("send"), conv, body, 0);
    if (!cmid.isEmpty())
        d->ephemeral.messageSent(conv); // a send ends typing (contract 13)
    return cmid;
}

bool Client::cancel(const QString &cmid) {
    if (!d->storage.isOpen())
        return false;
    return d->outbox.cancel(cmid);
}

bool Client::discard(const QString &cmid) {
    if (!d->storage.isOpen() || d->outbox.contains(cmid)) {
        d->reporter.lastError = QStringLiteral("%1 is not a Failed or Expired message").arg(cmid);
        return false;
    }
    const std::optional<detail::LocalMessage> m = d->storage.localMessage(cmid);
    bool found = false;
    if (!d->storage.discardMessage(cmid, &found)) {
        d->storageFailed(QStringLiteral("cannot discard message"));
        return false;
    }
    if (!found || !m) {
        d->reporter.lastError = QStringLiteral("%1 is not a Failed or Expired message").arg(cmid);
        return false;
    }
    emit d->timelineChanged(m->conv);
    return true;
}

void Client::setTyping(const QString &conv, bool typing) {
    if (!proto::checkConv(conv).isEmpty()) {
        d->refuse(QStringLiteral("setTyping needs a valid conversation id"));
        return;
    }
    d->ephemeral.setTyping(conv, typing);
}

QStringList Client::typingUsers(const QString &conv) const { return d->ephemeral.typists(conv); }

bool Client::isTyping(const QString &conv) const { return d->ephemeral.isTyping(conv); }

PresenceWatch *Client::watchPresence(const QStringList &users) { return new PresenceWatch(this, users, this); }

QString Client::recall(const QString &conv, qint64 seq) {
    if (!proto::checkConv(conv).isEmpty() || seq < 1) {
        d->reporter.lastError = QStringLiteral("recall needs a valid conversation id and a seq >= 1");
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
        return {};
    }
    return d->outbox.enqueue(QStringLiteral("recall"), conv, QString(), seq);
}

void ClientPrivate::fillQuotes(const QString &conv, QList<detail::MessageRow> &rows) {
    for (detail::MessageRow &r : rows) {
        if (r.replyTo <= 0 || r.quoteKnown)
            continue;
        const QString key = conv + QLatin1Char('\n') + QString::number(r.replyTo);
        const auto it = fetchedQuotes.constFind(key);
        if (it != fetchedQuotes.cend()) {
            r.quoteKnown = true;
            r.quoteSender = it->sender;
            r.quoteBody = it->body;
            continue;
        }
        if (!conn.isSessionUp() || quotesAsked.contains(key))
            continue;
        quotesAsked.insert(key);
        const QString rid = conn.nextRid();
        conn.request(rid, proto::encodeFetch(rid, conv, r.replyTo),
                     [this, key, conv](const std::optional<proto::Incoming> &reply) {
                         const auto *f = reply ? std::get_if<proto::Fetched>(&reply->body) : nullptr;
                         if (!f || f->ev.kind != u"msg") {
                             // Not readable (NOT_FOUND), or no answer: asked again
                             // by a later read only after no answer.
                             if (!reply)
                                 quotesAsked.remove(key);
                             return;
                         }
                         fetchedQuotes.insert(key, {f->ev.sender, f->ev.editSeq > 0 ? f->ev.editBody : f->ev.body});
                         emit timelineChanged(conv);
                     });
    }
}

QString ClientPrivate::refuse(const QString &why) {
    reporter.lastError = why;
    reportError(QStringLiteral("INVALID_ARGUMENT"), why);
    return {};
}

QString ClientPrivate::enqueueChange(const QString &kind, const QString &conv, qint64 target, const QString &cmid,
                                     const QString &body, const QString &emoji, bool on) {
    detail::OutboxRow row;
    row.kind = kind;
    row.conv = conv;
    row.body = body;
    row.emoji = emoji;
    row.on = on;
    row.target = target;
    if (target <= 0) {
        // Our own message by cmid: its seq if known, else it waits behind it.
        if (!storage.isOpen())
            return refuse(QStringLiteral("database not open"));
        bool final = false;
        row.target = storage.ownSeq(conv, cmid, &final);
        if (row.target <= 0) {
            if (!outbox.contains(cmid))
                return refuse(QStringLiteral("%1 is not a message of ours in %2 (or it failed)").arg(cmid, conv));
            row.targetCmid = cmid;
        }
    }
    return outbox.enqueue(std::move(row));
}

QString Client::reply(const QString &conv, qint64 seq, const QString &body) {
    if (const QString why = proto::checkSend(conv, body); !why.isEmpty())
        return d->refuse(QStringLiteral("reply refused: %1").arg(why));
    if (seq < 1)
        return d->refuse(QStringLiteral("reply refused: the replied-to seq must be >= 1"));
    detail::OutboxRow row;
    row.kind = QStringLiteral("send");
    row.conv = conv;
    row.body = body;
    row.replyTo = seq;
    const QString cmid = d->outbox.enqueue(std::move(row));
    if (!cmid.isEmpty())
        d->ephemeral.messageSent(conv);
    return cmid;
}

QString Client::edit(const QString &conv, qint64 target, const QString &body) {
    if (const QString why = proto::checkSend(conv, body); !why.isEmpty())
        return d->refuse(QStringLiteral("edit refused: %1").arg(why));
    if (target < 1)
        return d->refuse(QStringLiteral("edit refused: the target seq must be >= 1"));
    return d->enqueueChange(QStringLiteral("edit"), conv, target, {}, body, {}, false);
}

QString Client::edit(const QString &conv, const QString &cmid, const QString &body) {
    if (const QString why = proto::checkSend(conv, body); !why.isEmpty())
        return d->refuse(QStringLiteral("edit refused: %1").arg(why));
    if (cmid.isEmpty())
        return d->refuse(QStringLiteral("edit refused: no target cmid"));
    // Obligation 16: not on the wire yet: the entry itself takes the new body.
    switch (d->outbox.rewriteUnsent(cmid, body)) {
    case Outbox::Rewrite::Done: return cmid;
    case Outbox::Rewrite::Failed: return {}; // storage error, reported
    case Outbox::Rewrite::NotUnsent: break;  // on its way or sent: a change of its own
    }
    return d->enqueueChange(QStringLiteral("edit"), conv, 0, cmid, body, {}, false);
}

QString Client::react(const QString &conv, qint64 target, const QString &emoji, bool on) {
    if (const QString why = proto::checkConv(conv); !why.isEmpty())
        return d->refuse(QStringLiteral("react refused: %1").arg(why));
    if (const QString why = proto::checkEmoji(emoji); !why.isEmpty())
        return d->refuse(QStringLiteral("react refused: %1").arg(why));
    if (target < 1)
        return d->refuse(QStringLiteral("react refused: the target seq must be >= 1"));
    return d->enqueueChange(QStringLiteral("react"), conv, target, {}, {}, emoji, on);
}

QString Client::react(const QString &conv, const QString &cmid, const QString &emoji, bool on) {
    if (const QString why = proto::checkConv(conv); !why.isEmpty())
        return d->refuse(QStringLiteral("react refused: %1").arg(why));
    if (const QString why = proto::checkEmoji(emoji); !why.isEmpty())
        return d->refuse(QStringLiteral("react refused: %1").arg(why));
    if (cmid.isEmpty())
        return d->refuse(QStringLiteral("react refused: no target cmid"));
    return d->enqueueChange(QStringLiteral("react"), conv, 0, cmid, {}, emoji, on);
}

bool Client::markRead(const QString &conv, qint64 seq) {
    if (!d->storage.isOpen() || conv.isEmpty() || seq < 1) {
        d->reporter.lastError = QStringLiteral("markRead needs an open database, a conversation and a seq >= 1");
        d->reportError(QStringLiteral("INVALID_ARGUMENT"), d->reporter.lastError);
        return false;
    }
    return d->markers.markRead(conv, seq);
}

void Client::sync(const QString &conv) { d->sync.start(conv); }

void Client::syncAll() { d->sync.syncAll(); }

void Client::resendPending() { d->outbox.resendPending(); }

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
    d->sync.clear();
    d->id.installId = fresh;
    emit installIdChanged();
    if (d->id.stale) {
        d->id.stale = false;
        emit installStaleChanged(false);
    }
    for (const QString &c : convs) {
        emit conversationReset(c);
        emit d->timelineChanged(c);
    }
    emit d->conversationsChanged();
    return true;
}

// --- on-device search --------------------------------------------------

void ClientPrivate::startIndexBuild() {
    const std::optional<bool> complete = storage.searchIndexComplete();
    if (!complete) {
        storageFailed(QStringLiteral("cannot read the search index state"));
        return;
    }
    const double progress = *complete ? 1.0 : 0.0;
    if (progress != indexProgress) {
        indexProgress = progress;
        emit q->searchIndexProgressChanged(indexProgress);
        emit searchIndexChanged();
    }
    if (!*complete || !storage.searchIndexSettled().value_or(true))
        indexBuild.start();
}

void ClientPrivate::buildIndexStep() {
    if (!storage.isOpen()) {
        indexBuild.stop();
        return;
    }
    // A bounded batch (~8 ms) per event-loop turn: the app's thread keeps
    // painting and handling input while an older store is indexed.
    const std::optional<detail::Storage::IndexBuild> step = storage.buildSearchIndex(8);
    if (!step) {
        indexBuild.stop();
        storageFailed(QStringLiteral("search index build"));
        return;
    }
    const double progress = step->finished ? 1.0 // the merge after it changes no result
                            : step->total > 0 ? std::min(0.99, double(step->done) / double(step->total))
                                              : 0.0;
    if (step->settled)
        indexBuild.stop();
    if (progress != indexProgress) {
        indexProgress = progress;
        emit q->searchIndexProgressChanged(indexProgress);
        emit searchIndexChanged();
    }
}

int Client::search(const QString &query, const QString &conv, int limit, qint64 before) {
    if (!d->storage.isOpen())
        return 0;
    if (!d->search) {
        d->search = std::make_unique<detail::SearchService>(
            d->storage.path(), d.get(), [this](const detail::SearchService::Answer &a) {
                if (!a.error.isEmpty()) {
                    d->reporter.lastError = QStringLiteral("search: ") + a.error;
                    d->reportError(StorageError, d->reporter.lastError);
                }
                emit searchFinished(a.id, a.results, a.more, a.incomplete, a.purged);
            });
    }
    return d->search->search(query, conv, std::max(1, limit), before);
}

double Client::searchIndexProgress() const { return d->indexProgress; }

void Client::loadMissingHistory(const QString &conv) {
    if (!d->storage.isOpen())
        return;
    QStringList convs;
    if (conv.isEmpty()) {
        const std::optional<QList<detail::ConvRow>> rows = d->storage.conversations();
        if (!rows) {
            d->storageFailed(QStringLiteral("cannot read the conversations"));
            return;
        }
        for (const detail::ConvRow &r : *rows)
            convs << r.conv;
    } else {
        convs << conv;
    }
    for (const QString &c : std::as_const(convs)) {
        const std::optional<QList<detail::Gap>> gaps = d->storage.gaps(c);
        if (!gaps) {
            d->storageFailed(QStringLiteral("cannot read the gaps"));
            return;
        }
        const std::optional<detail::ConvRow> row = d->storage.conversation(c);
        if (!row)
            continue; // not known here
        if (!gaps->isEmpty())
            d->sync.loadOlder(c, gaps->last().hi + 1, gaps->last().lo); // the newest part first
        if (row->after < row->head)
            sync(c);
    }
}

} // namespace im
