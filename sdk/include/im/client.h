// im::Client: the public entry point of the SDK.
#pragma once

#include <im/global.h>
#include <im/search.h>
#include <im/types.h>

#include <QtCore/QDateTime>
#include <QtCore/QList>
#include <QtCore/QObject>
#include <QtCore/QString>
#include <QtCore/QUrl>
#include <QtCore/QVariantMap>

#include <memory>

namespace im {

class ClientPrivate;
class PresenceWatch;

/**
 * A chat client bound to one local database and one device token.
 *
 * Typical use:
 * \code
 *   im::Client client;
 *   client.setServers({QUrl("ws://chat.example:8080/v1/ws")});
 *   client.setCredentials(token);                       // the signed-in user's token
 *   // One store per user (obligation 10, docs/sdk.md "Quick start"):
 *   if (!client.open(dataDir + "/" + QString::fromLatin1(QUrl::toPercentEncoding(user)) + ".db"))
 *       qFatal("%s", qPrintable(client.lastError()));
 *   client.connectToServer();
 *   const QString cmid = client.send("team", "hello"); // durable before it returns
 * \endcode
 *
 * Guarantees (see docs/sdk.md):
 *  - send() and recall() commit the request to a durable outbox (SQLite WAL,
 *    synchronous=FULL) before any byte goes on the wire, and return its cmid.
 *    Anything still in the outbox is resent, with the same cmid, after every
 *    connect + hello (also after a process restart), in creation order.
 *  - Only UNAVAILABLE and "no reply" are retried; any other error is final and
 *    shows as MessageState::Failed (or Expired for ORIGINAL_EXPIRED).
 *  - A sync page, its markers and the new cursor are written in one
 *    transaction: a crash mid-page loses nothing and duplicates nothing.
 *
 * Threading: a Client lives in the thread that created it, or the one it was
 * moved to: moveToThread() takes all of its parts along (timers, socket).
 * Move it before open() and open() it on its new thread (the SQLite
 * connection belongs to the thread that opened it); see docs/sdk.md
 * "Threading". It never blocks its thread on the network; SQLite writes are
 * short transactions on that thread. Do not call it from other threads.
 *
 * Errors: every failed local database write is reported through
 * errorOccurred("STORAGE_ERROR", ...) and the return value of the call that
 * caused it; none is ignored.
 */
class IM_SDK_EXPORT Client : public QObject {
    Q_OBJECT
    /// Disconnected / Connecting / Connected / Reconnecting.
    Q_PROPERTY(im::ConnectionState connectionState READ connectionState NOTIFY connectionStateChanged)
    /// The `gateway` the server named in `welcome` (empty when not connected).
    Q_PROPERTY(QString gatewayId READ gatewayId NOTIFY connectionStateChanged)
    /// The server URL currently used or tried.
    Q_PROPERTY(QUrl currentServer READ currentServer NOTIFY connectionStateChanged)
    /// When the next reconnect attempt happens (invalid unless Reconnecting).
    Q_PROPERTY(QDateTime nextReconnectAt READ nextReconnectAt NOTIFY connectionStateChanged)
    /// User and device as confirmed by the server (remembered in the database).
    Q_PROPERTY(QString userId READ userId NOTIFY identityChanged)
    Q_PROPERTY(QString deviceId READ deviceId NOTIFY identityChanged)
    /// The install id (UUID) generated once per database and sent in `hello`.
    Q_PROPERTY(QString installId READ installId NOTIFY installIdChanged)
    /// True once the server answered STALE_INSTALL: a newer install of this
    /// device exists. The client stops using this install; see resetInstall().
    Q_PROPERTY(bool installStale READ isInstallStale NOTIFY installStaleChanged)
    /// Number of entries in the durable outbox (queue depth).
    Q_PROPERTY(int pendingCount READ pendingCount NOTIFY outboxChanged)
    /// How many of them are held: written as another user than this store's
    /// (obligation 10), never sent in its sessions; see isHeld().
    Q_PROPERTY(int heldCount READ heldCount NOTIFY heldDraftsChanged)
    /// How long a request may stay unanswered before it counts as "no reply".
    Q_PROPERTY(int requestTimeout READ requestTimeout WRITE setRequestTimeout NOTIFY requestTimeoutChanged)
    /// When the token runs out (UTC; invalid if unknown): the JWT's `exp`,
    /// or the `exp` of the server's last `token_expiring` / `refreshed`,
    /// corrected by the server's clock (from `welcome`).
    Q_PROPERTY(QDateTime tokenExpiresAt READ tokenExpiresAt NOTIFY tokenExpiresAtChanged)
    /// True after the server refused the token (UNAUTHENTICATED, close 4001)
    /// until setCredentials() hands over another one.
    Q_PROPERTY(bool awaitingCredentials READ isAwaitingCredentials NOTIFY awaitingCredentialsChanged)
    /// Settings, also from QML (`Client { sendWindow: 8 }`); see the setters.
    /// Every setting has a getter and a property (NOTIFY settingsChanged,
    /// but requestTimeout: requestTimeoutChanged). The server URLs (setServers()).
    Q_PROPERTY(QList<QUrl> servers READ servers WRITE setServers NOTIFY settingsChanged)
    /// Outbox requests unanswered at once (setSendWindow()).
    Q_PROPERTY(int sendWindow READ sendWindow WRITE setSendWindow NOTIFY settingsChanged)
    /// sendFile()'s size limit and the upload's bytes per request (setMaxFileSize(), setUploadChunkSize()).
    Q_PROPERTY(qint64 maxFileSize READ maxFileSize WRITE setMaxFileSize NOTIFY settingsChanged)
    Q_PROPERTY(int uploadChunkSize READ uploadChunkSize WRITE setUploadChunkSize NOTIFY settingsChanged)
    /// The upload throttle in bytes per second, 0 = unlimited (setUploadRateLimit()).
    Q_PROPERTY(qint64 uploadRateLimit READ uploadRateLimit WRITE setUploadRateLimit NOTIFY settingsChanged)
    /// Keep-alive ping interval and silence timeout in ms (setKeepAlive()).
    Q_PROPERTY(int pingInterval READ pingInterval WRITE setPingInterval NOTIFY settingsChanged)
    Q_PROPERTY(int silenceTimeout READ silenceTimeout WRITE setSilenceTimeout NOTIFY settingsChanged)
    /// TLS trust (setTrustedCaFile(), setPinnedCertificateSha256()): the PEM
    /// file of the CA(s) trusted instead of the system's store (empty: the
    /// system's store), and the pinned SHA-256 fingerprint (empty: none). A
    /// value that cannot be used leaves the setting as it was and is reported
    /// through lastError() and errorOccurred("INVALID_ARGUMENT").
    /// Request retry backoff, first and longest delay in ms (setRetryBackoff()).
    Q_PROPERTY(int retryBackoffInitial READ retryBackoffInitial WRITE setRetryBackoffInitial NOTIFY settingsChanged)
    Q_PROPERTY(int retryBackoffMax READ retryBackoffMax WRITE setRetryBackoffMax NOTIFY settingsChanged)
    /// Reconnect backoff, first and longest delay in ms (setReconnectBackoff()).
    Q_PROPERTY(int reconnectBackoffInitial READ reconnectBackoffInitial WRITE setReconnectBackoffInitial
                   NOTIFY settingsChanged)
    Q_PROPERTY(int reconnectBackoffMax READ reconnectBackoffMax WRITE setReconnectBackoffMax NOTIFY settingsChanged)
    /// Events per `sync` page (setSyncPageSize()).
    Q_PROPERTY(int syncPageSize READ syncPageSize WRITE setSyncPageSize NOTIFY settingsChanged)
    /// Events per `history` window and the backlog limit (setHistoryWindow(), setBacklogLimit()).
    Q_PROPERTY(int historyWindow READ historyWindow WRITE setHistoryWindow NOTIFY settingsChanged)
    Q_PROPERTY(int backlogLimit READ backlogLimit WRITE setBacklogLimit NOTIFY settingsChanged)
    Q_PROPERTY(QString trustedCaFile READ trustedCaFile WRITE setTrustedCaFileProperty NOTIFY settingsChanged)
    Q_PROPERTY(QString pinnedCertificateSha256 READ pinnedCertificateSha256 WRITE setPinnedCertificateSha256Property
                   NOTIFY settingsChanged)
    /// On-device search (obligation 18): how far the search index of a
    /// store written by an older SDK is built, 0..1 (1: complete; a new
    /// store is complete at once). See search().
    Q_PROPERTY(double searchIndexProgress READ searchIndexProgress NOTIFY searchIndexProgressChanged)
    /// Files received (obligation 17, docs/sdk.md "Receiving files"): the
    /// most bytes the download cache in the store's folder keeps (least
    /// recently used files go first; default 512 MiB, 0: no cache).
    Q_PROPERTY(qint64 downloadCacheSize READ downloadCacheSize WRITE setDownloadCacheSize NOTIFY settingsChanged)

public:
    /// Why credentialsNeeded() asks the app for a token (obligation 14).
    enum class CredentialsReason {
        /// The token expires soon: the server pushed `token_expiring`, or the
        /// JWT's own `exp` is less than 90 s away. The connection still works;
        /// hand over a new token with setCredentials() and it is swapped in
        /// on the open connection (`refresh`).
        Expiring,
        /// The server refused the token (UNAUTHENTICATED on `hello` or
        /// `refresh`, or closed the connection with 4001 at `exp`). The
        /// client stays disconnected and does not retry this token; the
        /// next setCredentials() reconnects.
        Rejected,
    };
    Q_ENUM(CredentialsReason)

    /// Who the token given to setCredentials() belongs to, compared with the
    /// token it replaces (obligation 10).
    enum TokenOwner {
        /// Not known (the default): drafts written under the previous token
        /// stay its own. A rejected or replaced opaque token that no
        /// `welcome` ever proved keeps its drafts held; they never go out
        /// under the new token (on a shared machine, ana's revoked token and
        /// then ben's sign-in never send ana's drafts as ben).
        UnknownUser,
        /// The app knows it is the same person (a re-issued token after a
        /// rejection, a new device token of the same account): drafts of the
        /// previous token that no welcome has proven go with the new one,
        /// and an opaque new token counts as the previous token's proven
        /// user. Two JWTs whose `sub`s differ move nothing whatever the flag.
        SameUser,
    };
    Q_ENUM(TokenOwner)

    explicit Client(QObject *parent = nullptr);
    ~Client() override;

    // --- configuration ---------------------------------------------------
    // (Q_INVOKABLE: callable from QML, see docs/sdk.md "QML")
    /// Server URLs (ws://HOST:PORT/v1/ws). Reconnects rotate through them;
    /// `goaway` moves to the next one.
    Q_INVOKABLE void setServers(const QList<QUrl> &servers);
    QList<QUrl> servers() const;
    /// TLS (wss:// URLs): the server's certificate and host name are checked
    /// against the system's trust store, TLS 1.2 or later. To trust only your
    /// own CA instead, give its certificate(s) here (a PEM file; an empty path
    /// goes back to the system's store). Returns false and sets lastError() if
    /// the file holds no certificate. A TLS failure is never ignored: the
    /// attempt fails with errorOccurred("TLS_ERROR") (lastError() keeps it) and
    /// is retried after the reconnect backoff (a captive portal goes away).
    Q_INVOKABLE bool setTrustedCaFile(const QString &pemFile);
    QString trustedCaFile() const;
    /// wss:// certificate pinning: the server's certificate must have this
    /// SHA-256 fingerprint (64 hex digits, colons allowed, as printed by
    /// `openssl x509 -noout -fingerprint -sha256`; empty removes the pin). A
    /// pinned certificate is trusted even if self-signed or issued for another
    /// name; any other certificate fails with TLS_ERROR. Returns false and sets
    /// lastError() if the fingerprint is malformed.
    Q_INVOKABLE bool setPinnedCertificateSha256(const QString &fingerprint);
    QString pinnedCertificateSha256() const;
    /// The device token: a random token issued by the server's admin CLI, or
    /// a JWT signed by the app's backend (contract section 4a). Used for the
    /// next `hello`. While connected, a JWT is also sent as `refresh`, so the
    /// open connection carries on under it (no reconnect). After a rejection
    /// (awaitingCredentials) it reconnects, if connectToServer() was called.
    /// Answer credentialsNeeded() with this. What send() and recall() queue is
    /// bound to the credential it was written under (a JWT's `sub`, else the
    /// token's fingerprint until a `welcome` under that token proves its
    /// user) and never sent on a session of another user: until then it is
    /// held (isHeld(), heldCount). This overload is
    /// setCredentials(token, UnknownUser): drafts of the previous token are
    /// never carried to this one.
    Q_INVOKABLE void setCredentials(const QString &token);
    /// The same, saying whose token it is compared with the previous one
    /// (see TokenOwner): `SameUser` carries the previous token's unproven
    /// drafts to this one (typically the answer to credentialsNeeded(Rejected)
    /// when the same person signed in again).
    Q_INVOKABLE void setCredentials(const QString &token, im::Client::TokenOwner owner);
    void setRequestTimeout(int ms);
    int requestTimeout() const;
    /// Retry backoff for unanswered/UNAVAILABLE requests while connected:
    /// min(maxMs, initialMs * 2^(attempt-1)), jittered into [d/2, d].
    /// Defaults 250 and 30000; initialMs >= 1, maxMs >= initialMs.
    Q_INVOKABLE void setRetryBackoff(int initialMs, int maxMs);
    int retryBackoffInitial() const;
    int retryBackoffMax() const;
    /// setRetryBackoff() with one of the two values changed (the other moves
    /// only if it must, so that initial <= max); the same for the reconnect
    /// backoff below.
    void setRetryBackoffInitial(int ms);
    void setRetryBackoffMax(int ms);
    /// Backoff between reconnect attempts (same shape as above; defaults 500
    /// and 30000). It starts over once a session has stayed up 30 s, not at
    /// every welcome.
    Q_INVOKABLE void setReconnectBackoff(int initialMs, int maxMs);
    int reconnectBackoffInitial() const;
    int reconnectBackoffMax() const;
    void setReconnectBackoffInitial(int ms);
    void setReconnectBackoffMax(int ms);
    /// Page size for `sync` (1..200, default 100; clamped).
    Q_INVOKABLE void setSyncPageSize(int limit);
    int syncPageSize() const;
    /// History windows (docs/sdk.md): events per `history` window (1..200,
    /// default 100), and how far behind (or new to this install) a
    /// conversation may be before it opens with its newest window and keeps
    /// a gap instead of syncing everything (default 1000 events; <= 0: never).
    Q_INVOKABLE void setHistoryWindow(int events);
    Q_INVOKABLE void setBacklogLimit(int events);
    int historyWindow() const;
    int backlogLimit() const;
    /// How many outbox requests may be unanswered at once, all conversations
    /// together (default 128). A conversation's messages are pipelined in
    /// creation order, each naming the one before it as `prev`, so the
    /// server never commits message 2 of a conversation after failing
    /// message 1 (obligation 9, docs/sdk.md). 1 sends one request at a time.
    Q_INVOKABLE void setSendWindow(int requests);
    int sendWindow() const;
    /// Liveness watchdog: a WebSocket ping every `pingIntervalMs` (default
    /// 10 s) while connected; a connection on which nothing (no frame, no
    /// pong) arrived for `silenceTimeoutMs` (default 25 s) is dropped and
    /// reconnected. Both use a monotonic clock.
    Q_INVOKABLE void setKeepAlive(int pingIntervalMs, int silenceTimeoutMs);
    int pingInterval() const;
    int silenceTimeout() const;
    /// setKeepAlive() with one of the two values changed (the silence
    /// timeout is never below the ping interval).
    void setPingInterval(int ms);
    void setSilenceTimeout(int ms);

    // --- local database --------------------------------------------------
    /// Opens (creating or migrating) the local database. Loads the outbox and
    /// the install id. Returns false and sets lastError() on failure.
    Q_INVOKABLE bool open(const QString &databasePath);
    Q_INVOKABLE bool isOpen() const;
    /// Closes the database (and disconnects).
    Q_INVOKABLE void close();
    QString databasePath() const;
    /// Human-readable reason of the last failed call.
    Q_INVOKABLE QString lastError() const;

    // --- state -------------------------------------------------------------
    ConnectionState connectionState() const;
    QString gatewayId() const;
    QUrl currentServer() const;
    QDateTime nextReconnectAt() const;
    QString userId() const;
    QString deviceId() const;
    QString installId() const;
    bool isInstallStale() const;
    int pendingCount() const;
    int heldCount() const;
    /// Whether the outbox entry `cmid` is held (obligation 10): written under
    /// a token no `welcome` has proven to be this store's user (another
    /// user's token, or one replaced before it ever connected). It shows
    /// Pending with the role `held` in MessageListModel and OutboxModel, is
    /// never sent in this store's sessions, and goes out only once a session
    /// opened with its own token proves it this store's user. cancel() or
    /// discardHeldDrafts() drops it.
    Q_INVOKABLE bool isHeld(const QString &cmid) const;
    QDateTime tokenExpiresAt() const;
    bool isAwaitingCredentials() const;
    /// The durable outbox in creation order, with attempts, last error and
    /// next retry time of each entry (QML: a list of `outboxEntry` values;
    /// for a live view use OutboxModel).
    Q_INVOKABLE QList<im::OutboxEntry> outbox() const;
    /// Local state of a message or recall request by cmid (Pending if unknown).
    /// A point lookup in the local store (a few indexed reads, whatever the
    /// conversation's length): fine to call per row.
    Q_INVOKABLE MessageState messageState(const QString &cmid) const;
    /// Conversation ids known locally.
    Q_INVOKABLE QStringList conversationIds() const;

    // --- typing and presence (contract section 13, obligation 19) ---------
    /// Who else is typing in `conv` now (user ids, sorted): from the
    /// server's `typing` pushes, each lasting 6 s unless renewed, ended by
    /// their `on:false` or by a message from them. Also the `typing` role
    /// of ConversationListModel; typingChanged() tells of every change.
    Q_INVOKABLE QStringList typingUsers(const QString &conv) const;
    /// Whether this user is typing in `conv` as far as setTyping() knows.
    Q_INVOKABLE bool isTyping(const QString &conv) const;
    /// Watches the presence of `users` (online, last seen): a new
    /// PresenceWatch, a child of this client (delete it to stop watching).
    /// See im::PresenceWatch; from QML declare `PresenceWatch { }` instead.
    Q_INVOKABLE im::PresenceWatch *watchPresence(const QStringList &users);
    // --- on-device search (obligation 18, docs/sdk.md "Search") -----------
    /// Searches the stored messages for `query` (every word must match:
    /// Latin words by prefix, case- and accent-insensitive; Chinese,
    /// Japanese and Korean by any substring), in `conv` (empty: all),
    /// newest first, at most `limit` results below `before` (0: from the
    /// newest; else the `position` of the last result of the previous
    /// page). Runs on the client's search thread (a read-only connection of
    /// its own): the answer comes as searchFinished() with the returned id.
    /// Returns 0 (no answer follows) if no store is open. im::SearchModel
    /// is the same for views.
    Q_INVOKABLE int search(const QString &query, const QString &conv = QString(), int limit = 50, qint64 before = 0);
    double searchIndexProgress() const;
    /// Loads more of the history of `conv` (empty: of every conversation)
    /// that is not stored here (searchFinished()'s incompleteConversations):
    /// the newest part of its newest gap (a `history` window) and a sync up
    /// to the head. Needs a connection; eventsApplied()/conversationSynced()
    /// follow. Each call loads one more window per gap.
    Q_INVOKABLE void loadMissingHistory(const QString &conv = QString());

    // --- files (obligation 17, docs/sdk.md "Sending files") ---------------
    /// Sends the file at `path` (with `body`, which may be empty: 0-4000
    /// code points) as one message with one attachment. Before it returns,
    /// the file is copied into the store's own folder ("<database>.files")
    /// and the outbox entry (name, mime type, size, SHA-256) is committed:
    /// the app may delete or change its file at once, and a crash or kill
    /// at any later point still ends in exactly one message with exactly
    /// this file. The upload runs on the client's thread (HTTP to the
    /// server of the WebSocket, resumed from the server's offset after a
    /// reconnect, restart or kill; uploadProgress()); the message goes out
    /// with the same cmid once the upload is complete, and later messages
    /// of `conv` wait behind it (Pending). Returns the cmid, or empty with
    /// nothing queued: INVALID_ARGUMENT (bad conversation or body, no such
    /// file, not a regular file, unreadable, a name the server refuses),
    /// TOO_LARGE (over maxFileSize()), STORAGE_ERROR (the copy or the
    /// outbox write failed). cancel() of the entry (while the message has
    /// not gone on the wire) also ends the upload and removes it from the
    /// server.
    Q_INVOKABLE QString sendFile(const QString &conv, const QString &path, const QString &body = QString());
    /// Where the upload of sendFile() entry `cmid` stands: {"sent": bytes
    /// at the server as far as known, "total": the file's size, "complete":
    /// bool}; empty for a cmid that is not a file in the outbox.
    Q_INVOKABLE QVariantMap uploadState(const QString &cmid) const;
    /// The largest file sendFile() accepts (default 104857600, the server's
    /// default --max-attachment-bytes). A server with a lower limit fails
    /// the message with TOO_LARGE when its upload starts.
    void setMaxFileSize(qint64 bytes);
    qint64 maxFileSize() const;
    /// Bytes per upload request (PUT), 65536 - 8388608, default 4194304.
    /// A resume after a kill re-sends at most one of them.
    void setUploadChunkSize(int bytes);
    int uploadChunkSize() const;
    /// The upload throttle, for apps on slow or metered links and for QA:
    /// at most `bytesPerSecond` bytes of file data a second go to the
    /// server (0, the default: unlimited; negative counts as 0). Paced on
    /// the client's thread without blocking it: the PUTs get smaller (a
    /// quarter second's worth, at least 4 KiB, at most uploadChunkSize())
    /// and each waits on a timer until the bytes before it fit the rate.
    /// Applies from the next PUT, also to an upload under way.
    void setUploadRateLimit(qint64 bytesPerSecond);
    qint64 uploadRateLimit() const;

    // --- files received (obligation 17, docs/sdk.md "Receiving files") ---
    /// Downloads attachment `attId` (an `id` of a message's `attachments`)
    /// to the file `path`, in the background: from the cache when it holds
    /// it, else GET /v1/attachments/{id} from the connection's server (its
    /// TLS trust and pin, the current credentials), resumed with `Range`
    /// after a drop or a restart, its SHA-256 checked before `path` is
    /// written (a complete file or none). Returns the request id, which is
    /// `attId` (signals are keyed by it; a second call for an attachment
    /// under way adds `path` to it), or empty for bad input (no open store,
    /// not an id, no such folder: errorOccurred("INVALID_ARGUMENT")).
    /// Ends in downloadFinished() for each path or downloadFailed().
    Q_INVOKABLE QString download(const QString &attId, const QString &path);
    /// Stops a download under way (no signal follows; the part received is
    /// kept, a later download() resumes it). False if none runs.
    Q_INVOKABLE bool cancelDownload(const QString &attId);
    Q_INVOKABLE bool isDownloading(const QString &attId) const;
    Q_INVOKABLE void setDownloadCacheSize(qint64 bytes);
    qint64 downloadCacheSize() const;

public Q_SLOTS:
    /// Connects (asynchronously) and keeps reconnecting until
    /// disconnectFromServer(). Needs open() and credentials.
    void connectToServer();
    void disconnectFromServer();

    /// Queues a message. The outbox row is committed before this returns; the
    /// returned cmid (UUID v4) identifies it in messageStateChanged() and the
    /// models. A body the server would refuse (empty, over 4000 code points,
    /// not valid Unicode, U+0000) or an invalid conversation id is refused at
    /// once: empty string, errorOccurred("INVALID_ARGUMENT"), nothing queued.
    /// Also empty (STORAGE_ERROR) if the local write failed.
    QString send(const QString &conv, const QString &body);
    /// Withdraws a Pending message (or recall request) that has not gone on
    /// the wire yet: it leaves the outbox and the timeline. Once an attempt
    /// has been sent it may already be committed, so cancel() refuses it
    /// (returns false, lastError() says why): recall it once it shows Sent.
    bool cancel(const QString &cmid);
    /// Drops every held draft (isHeld()) from the outbox and the timeline: the
    /// app's answer to "these were written as someone else" (show them, then
    /// let the user throw them away). Returns how many, or -1 on a local
    /// database error (errorOccurred("STORAGE_ERROR")).
    int discardHeldDrafts();
    /// Removes a Failed or Expired message from the local timeline (it is not
    /// resent). Returns false for any other state or an unknown cmid.
    bool discard(const QString &cmid);
    /// Queues a recall of one of our messages at `seq`, through the same
    /// durable outbox (own cmid). The target shows Recalled once the recall
    /// event is applied. Returns the recall request's cmid, or empty on error.
    QString recall(const QString &conv, qint64 seq);

    // Replies, edits and reactions (contract section 12, obligation 16).
    // Each is durable like send(): committed to the outbox before it
    // returns, resent with its own cmid, in creation order with the
    // messages of its conversation; each returns its request's cmid (or
    // empty, errorOccurred("INVALID_ARGUMENT") for bad input, nothing
    // queued). The timeline shows it at once, marked pending
    // (MessageListModel.s changePending role) until the
    // server confirms; a terminal answer (EDIT_WINDOW_EXPIRED, NOT_SENDER,
    // ALREADY_RECALLED, NOT_FOUND, INVALID_ARGUMENT) shows as Failed in
    // messageStateChanged() for that cmid, and the timeline drops the change.

    /// Sends `body` as a reply to the message at `seq` (the `reply_to` of
    /// the contract). Body rules as for send().
    QString reply(const QString &conv, qint64 seq, const QString &body);
    /// A new body for our message at `target` (a seq). The edit with the
    /// highest seq wins; the message keeps its seq.
    QString edit(const QString &conv, qint64 target, const QString &body);
    /// A new body for our message `cmid` (what send() or reply() returned),
    /// also while it is still Pending: if no attempt of it has gone on the
    /// wire yet, the outbox entry itself is rewritten (one request with the
    /// new body) and `cmid` is returned; otherwise the edit waits behind its
    /// target and goes once the target has its seq (it fails, NOT_FOUND, if
    /// the target fails).
    QString edit(const QString &conv, const QString &cmid, const QString &body);
    /// Turns our reaction `emoji` (1-64 bytes of UTF-8, no control
    /// characters) on the message at `target` on or off. At most 20
    /// distinct emoji of ours per message (the server answers
    /// INVALID_ARGUMENT beyond).
    QString react(const QString &conv, qint64 target, const QString &emoji, bool on);
    /// react() on our own message `cmid`, also while it is Pending: the
    /// reaction waits behind it until it has its seq.
    QString react(const QString &conv, const QString &cmid, const QString &emoji, bool on);

    /// Tells the others in `conv` that this user is typing (true) or
    /// stopped (false). Call it on every keystroke: the first call sends
    /// `typing` at once, calls that keep coming renew it every 3 s, and it
    /// stops by itself 5 s after the last call, on false, and on send() or
    /// reply() in `conv`. Ephemeral: sent only while connected, never
    /// queued in the outbox nor resent after a reconnect, at most 2 frames
    /// a second per conversation (the gateway's limit).
    void setTyping(const QString &conv, bool typing);

    /// Marks everything up to `seq` read (sent now if connected, else after
    /// the next hello). Returns false on a local database error.
    bool markRead(const QString &conv, qint64 seq);
    /// Pulls a conversation from its cursor until has_more is false.
    void sync(const QString &conv);
    /// sync() for every conversation known locally.
    void syncAll();
    /// Resends the whole outbox now, in creation order, same cmids.
    /// Called automatically after every connect + hello.
    void resendPending();
    /// After STALE_INSTALL: drops the local events, conversations and cursors,
    /// generates a new install id, and keeps the outbox (resending it is safe:
    /// the request key is (conv, user, cmid)). Returns false on a database error.
    bool resetInstall();

Q_SIGNALS:
    void connectionStateChanged(im::ConnectionState state);
    void identityChanged();
    void installIdChanged();
    void installStaleChanged(bool stale);
    void requestTimeoutChanged(int ms);
    void tokenExpiresAtChanged();
    void awaitingCredentialsChanged(bool awaiting);
    /// A setting changed: servers, sendWindow, pingInterval, silenceTimeout, the retry
    /// or reconnect backoff, syncPageSize, historyWindow, backlogLimit,
    /// trustedCaFile or pinnedCertificateSha256 (requestTimeout has its own
    /// signal).
    void settingsChanged();
    /// The app should hand over a new token with setCredentials()
    /// (obligation 14). Expiring: ahead of the token's expiry, at most once
    /// per token. Rejected: the server refused it; nothing is lost meanwhile:
    /// outbox entries stay Pending and go out once a token works.
    void credentialsNeeded(im::Client::CredentialsReason reason);
    /// A message or recall request changed state. `seq` is 0 until known;
    /// `errorCode` is set for Failed / Expired.
    void messageStateChanged(const QString &conv, const QString &cmid, qint64 seq,
                             im::MessageState state, const QString &errorCode);
    /// Events [fromSeq, toSeq] of `conv` were applied to the local database
    /// (from a sync page or a push).
    void eventsApplied(const QString &conv, qint64 fromSeq, qint64 toSeq);
    /// A conversation's local events were dropped (EPOCH_CHANGED, install reset).
    void conversationReset(const QString &conv);
    /// The answer to search() `requestId`: up to `limit` results, whether
    /// more follow (search() again with the last result's position), and,
    /// for a first page (before 0), the searched conversations whose
    /// history is not all stored here (loadable: loadMissingHistory()) and
    /// those whose oldest events were purged before this device saw them.
    /// A failed query answers with no results (and errorOccurred("STORAGE_ERROR")).
    void searchFinished(int requestId, const QList<im::SearchResult> &results, bool hasMore,
                        const QStringList &incompleteConversations, const QStringList &purgedConversations);
    void searchIndexProgressChanged(double progress);
    /// `received` of `total` bytes of attachment `attId` are on disk
    /// (`total` -1 while unknown); a resumed download starts at what it had.
    void downloadProgress(const QString &attId, qint64 received, qint64 total);
    /// Attachment `attId` is at `path`, complete and checked.
    void downloadFinished(const QString &attId, const QString &path);
    /// The download of `attId` ended without the file: NOT_FOUND (unknown,
    /// or not visible to this user), UNAUTHENTICATED, DIGEST_MISMATCH (the
    /// bytes twice did not match the SHA-256), UNAVAILABLE (the network,
    /// after retries; the part received is kept), TLS_ERROR, STORAGE_ERROR.
    void downloadFailed(const QString &attId, im::Error error, const QString &code, const QString &message);
    /// A sync of `conv` reached the server's head (has_more false).
    void conversationSynced(const QString &conv);
    /// typingUsers(conv) changed: `users` are typing in `conv` now.
    void typingChanged(const QString &conv, const QStringList &users);
    /// The conversation list or its markers (head, unread, read, delivered) changed.
    void conversationsChanged();
    /// The outbox changed (entry added, removed, attempt recorded).
    void outboxChanged();
    /// heldCount changed: drafts became held (written under another user's
    /// token, a store opened with another token) or were released (a welcome
    /// proved their token this store's user) or dropped.
    void heldDraftsChanged(int count);
    /// `sent` of `total` bytes of the file of sendFile() entry `cmid` are at
    /// the server (during a request too; after a resume it starts from the
    /// server's offset).
    void uploadProgress(const QString &cmid, qint64 sent, qint64 total);
    /// Something failed that the app should know about: a server error code
    /// (e.g. UNAUTHENTICATED, NOT_MEMBER, STALE_INSTALL), "STORAGE_ERROR",
    /// "PROTOCOL_ERROR" or "INVALID_ARGUMENT" (bad call).
    void errorOccurred(const QString &code, const QString &message);
    /// The same report, typed: emitted right after every errorOccurred().
    void errorReported(im::Error error, const QString &code, const QString &message);

private:
    // The properties' WRITE functions: the bool setters, results dropped.
    void setTrustedCaFileProperty(const QString &pemFile);
    void setPinnedCertificateSha256Property(const QString &fingerprint);
    friend class ClientPrivate;
    std::unique_ptr<ClientPrivate> d;
};

} // namespace im

// watchPresence() returns one (moc needs the complete type).
#include <im/presencewatch.h>
