// An in-process fake of the chat server for SDK tests: a QWebSocketServer on
// 127.0.0.1 (port 0) that speaks the wire contract with a tiny in-memory
// store, plus knobs to misbehave (drop replies, UNAVAILABLE, close mid-request,
// reorder pushes, bump epochs, trim, goaway, STALE_INSTALL). `history`
// answers windows as imserver does (contract section 6).
//
// Like imserver (spec/contract.md): a request key (conv, sender, cmid) with
// another body/target answers IDEMPOTENCY_MISMATCH; a second recall of one
// target answers ALREADY_RECALLED; `edit` and `react` follow contract
// section 12 (NOT_FOUND, INVALID_ARGUMENT, NOT_SENDER, ALREADY_RECALLED,
// EDIT_WINDOW_EXPIRED; a react that changes nothing appends nothing); a recall past the conversation's window
// answers RECALL_WINDOW_EXPIRED; a send whose `prev` names a key of the
// sender not yet stored answers UNAVAILABLE; events carry the sender's cmid when
// eventsCarryCmid is set; createConv()/
// addMember()/removeMember() append join/leave events as imserver's admin does.
#pragma once

#include <QtCore/QHash>
#include <QtCore/QJsonObject>
#include <QtCore/QList>
#include <QtCore/QObject>
#include <QtCore/QSet>
#include <QtCore/QUrl>

#include <functional>

class QWebSocket;
class QWebSocketServer;

class FakeServer : public QObject {
    Q_OBJECT
public:
    struct Conv {
        QString kind = QStringLiteral("group");
        QStringList members;
        qint64 epoch = 1;
        qint64 minSeq = 1;
        QList<QJsonObject> events;            // index i holds seq i + 1
        QHash<QString, qint64> keys;          // "user\ncmid" -> seq
        QHash<QString, QString> fingerprints; // "user\ncmid" -> "send\nBODY" / "recall\nTARGET"
        qint64 recallWindowMs = 120000;       // imserver's default
        qint64 editWindowMs = 172800000;      // contract section 12's default; 0: no edits
        QHash<QString, qint64> reactionState; // "user\ntarget\nemoji" -> seq of the event that set it on
        QHash<QString, qint64> delivered;     // device -> seq
        QHash<QString, qint64> read;          // user -> seq
        qint64 head() const { return events.size(); }
    };

    explicit FakeServer(QObject *parent = nullptr);
    ~FakeServer() override;

    bool listen();
    QUrl url() const;
    void stop();

    // data
    QHash<QString, Conv> convs;
    QSet<QString> staleInstalls;       // hello with these installs gets STALE_INSTALL
    QList<QJsonObject> received;       // every request frame, in arrival order
    QStringList installsSeen;
    int connections = 0;
    int historyRequests = 0;           // `history` windows answered (contract section 6)

    // knobs (per request type "send", "sync", ...): how many to affect
    QHash<QString, int> dropReplies;   // process, but do not reply
    QHash<QString, int> unavailable;   // answer UNAVAILABLE without processing
    QHash<QString, int> rateLimited;   // answer RATE_LIMITED with retry_ms = rateLimitRetryMs, unprocessed
    qint64 rateLimitRetryMs = 300;
    QHash<QString, int> closeOn;       // close the socket on receipt, without processing
    QHash<QString, QString> failWith;  // answer this terminal code (while set)
    QHash<QString, int> holdReplies;   // process, keep the reply until releaseHeld()
    bool pushEvents = true;            // push `event` to subscribed members
    // Events of send/recall carry the sender's cmid, as imserver's do. Off by
    // default only because tst_client's retry tests (owned by the SDK work)
    // count resends that a pushed own event would make unnecessary; new tests
    // should turn it on.
    bool eventsCarryCmid = false;
    int pageLimit = 0;                 // > 0 caps sync pages
    // Contract section 12: msg events in pages and `fetched` carry their
    // later changes (edit, reactions with `me` for the asker, reactions_seq,
    // recalled) as of the answer, as imserver's do; pushes carry none.
    bool annotateChanges = true;
    std::function<void(const QJsonObject &)> onFrame; // runs before any processing

    // Tokens (contract sections 4, 4a). `hello` and `refresh` accept
    // "tok-USER" or a JWT-shaped token (see jwt()) naming `sub`; a token in
    // rejectedTokens, a JWT past its `exp`, or a refresh to another user
    // answers UNAUTHENTICATED and closes the connection, as imserver does.
    QSet<QString> rejectedTokens;
    qint64 refreshedExpMs = 0;         // `exp` of `refreshed` (0: now + 1 h)
    /// An unsigned token of the shape of a JWT (header.payload.signature)
    /// with claims sub, device and exp (seconds since the epoch).
    static QString jwt(const QString &sub, qint64 expSecs);

    // actions
    qint64 append(const QString &conv, const QString &sender, const QString &body, const QString &cmid = {});
    /// Appends any event (kind and its fields in `ev`; seq, mid, ts, epoch added) and pushes it.
    qint64 appendEvent(const QString &conv, const QJsonObject &ev) { return addEvent(conv, ev); }
    qint64 appendRecall(const QString &conv, const QString &sender, qint64 target, const QString &cmid = {});
    // As imserver's admin: a new conversation whose members each join with a `join` event.
    void createConv(const QString &conv, const QStringList &members, const QString &kind = QStringLiteral("group"));
    qint64 addMember(const QString &conv, const QString &user);    // `join` event; returns its seq
    qint64 removeMember(const QString &conv, const QString &user); // `leave` event; returns its seq
    void pushToAll(const QJsonObject &frame);
    /// `token_expiring` (contract 4a) to every authenticated connection.
    void pushTokenExpiring(qint64 expMs);
    /// Closes every connection with a WebSocket close code (4001: token expired).
    void closeAllWithCode(int code, const QString &reason);
    void bumpEpoch(const QString &conv);
    void closeAll();
    void releaseHeld();

    QList<QJsonObject> requests(const QString &type) const;
    QStringList distinctCmids(const QString &conv = {}) const;
    int subscribedCount() const;
    /// Connections open now (a killed client's is gone once the fake has
    /// read everything it sent and seen the close).
    int openSessions() const { return static_cast<int>(sessions_.size()); }

    static QJsonObject demoEvent(const QString &conv, qint64 seq, const QString &sender, const QString &body,
                                 qint64 epoch);

signals:
    void frameReceived(const QJsonObject &frame);

private:
    struct Session {
        QString user, device;
        bool subscribed = false;
        QString token;
    };
    void onConnection();
    void handle(QWebSocket *s, const QJsonObject &req);
    void reply(QWebSocket *s, const QJsonObject &req, QJsonObject body);
    void error(QWebSocket *s, const QJsonObject &req, const QString &code);
    QJsonObject process(QWebSocket *s, const QJsonObject &req);
    qint64 addEvent(const QString &conv, QJsonObject ev);
    QJsonObject withChanges(const Conv &c, const QJsonObject &ev, const QString &asker) const;
    QJsonObject change(const QString &t, const QString &convId, const QJsonObject &req, const Session &ses);
    /// The user a token names, or empty if it is refused.
    QString userOfToken(const QString &token) const;

    QWebSocketServer *server_ = nullptr;
    QHash<QWebSocket *, Session> sessions_;
    QList<QPair<QWebSocket *, QByteArray>> held_;
};
