// Obligation 10 (spec sdk.md, rewritten; issue 48 "A draft never changes
// hands"): a draft belongs to the user of the token it was written under.
// Until a `welcome` proves which user an opaque token is, its drafts are
// held: shown as held, never sent in another token's session; they go out
// only in a session whose welcome names that user.
//
// One layer at a time against the in-process fake server (tokens "tok-USER"
// are opaque there, anything else that is not a JWT is refused); end to end
// against the real imserver where it is part of the build.
#include "fakeserver.h"
#include "sdktestutil.h"

#include <im/client.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#ifdef IM_SERVER_BIN
#include "exerelative.h"
#include "realclient.h"
#endif

#include <memory>

using im::Client;
using im::ConnectionState;
using im::MessageState;

namespace {

const QString Conv = QStringLiteral("c1");

// Every `send` frame the fake server received for `cmid`.
int sendsOf(const FakeServer &server, const QString &cmid) {
    int n = 0;
    for (const QJsonObject &req : server.requests(QStringLiteral("send")))
        n += req.value(QStringLiteral("cmid")).toString() == cmid ? 1 : 0;
    return n;
}

// The sender the fake server stored for `cmid` (empty: never stored).
QString storedSender(const FakeServer &server, const QString &cmid) {
    for (const QJsonObject &e : server.convs.value(Conv).events)
        if (e.value(QStringLiteral("cmid")).toString() == cmid)
            return e.value(QStringLiteral("sender")).toString();
    return {};
}

struct Fixture {
    QTemporaryDir dir;
    FakeServer server;
    std::unique_ptr<Client> client;
    QString db;

    Fixture() {
        server.listen();
        server.eventsCarryCmid = true;
        server.convs[Conv].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        db = dir.filePath(QStringLiteral("shared.db"));
    }
    // A fresh Client on the shared store under `token` (not connected).
    Client &reopen(const QString &token) {
        client.reset();
        client = std::make_unique<Client>();
        client->setServers({server.url()});
        client->setRequestTimeout(2000);
        client->setRetryBackoff(40, 300);
        client->setReconnectBackoff(40, 200);
        client->setCredentials(token);
        if (!client->open(db))
            qWarning("open: %s", qPrintable(client->lastError()));
        return *client;
    }
    bool connected() {
        client->connectToServer();
        return QTest::qWaitFor([this] { return client->connectionState() == ConnectionState::Connected; }, 10000);
    }
    // The store belongs to `user`: one session under tok-USER, then closed.
    bool ownedBy(const QString &user) {
        reopen(QStringLiteral("tok-") + user);
        const bool ok = connected() && client->userId() == user;
        client.reset();
        return ok;
    }
};

} // namespace

class TestDrafts : public QObject {
    Q_OBJECT
private slots:
    void a_draft_under_another_users_token_is_held_in_an_owned_store();
    void a_draft_under_a_proven_token_is_not_held_after_a_restart();
    void the_session_binds_the_token_its_hello_carried();
    void a_jwt_handed_over_during_the_handshake_is_sent_as_refresh();
    void a_rejection_of_a_superseded_token_reconnects_with_the_newer_one();
    void an_expiry_close_of_a_replaced_token_reconnects_with_the_new_one();
    void drafts_of_a_rejected_token_are_not_carried_to_another_user();
    void same_user_carries_the_rejected_tokens_drafts();
    void held_drafts_show_as_held_in_both_models_and_can_be_discarded();
#ifdef IM_SERVER_BIN
    void real_server_never_stores_a_draft_as_the_stores_user();
#endif
};

// Defect 1 (outbox.cpp credentialOf): ana's store, opened offline with ben's
// opaque token for one draft, then with ana's token again. The draft is
// held from the moment it is written, and ana's session never sends it.
void TestDrafts::a_draft_under_another_users_token_is_held_in_an_owned_store() {
    Fixture f;
    QVERIFY(f.ownedBy(QStringLiteral("ana")));
    QString draft;
    bool heldAtOnce = false;
    int heldCount = 0;
    {
        Client &ben = f.reopen(QStringLiteral("tok-ben"));
        draft = ben.send(Conv, QStringLiteral("ben's draft"));
        QVERIFY(!draft.isEmpty());
        heldAtOnce = ben.isHeld(draft);
        heldCount = ben.heldCount();
    }
    Client &ana = f.reopen(QStringLiteral("tok-ana"));
    const bool heldReopened = ana.isHeld(draft);
    QVERIFY(f.connected());
    const QString own = ana.send(Conv, QStringLiteral("ana's own"));
    QTRY_COMPARE(ana.messageState(own), MessageState::Sent);
    QCOMPARE(storedSender(f.server, own), QStringLiteral("ana"));
    QCOMPARE(sendsOf(f.server, draft), 0);
    QCOMPARE(ana.messageState(draft), MessageState::Pending);
    // Shown held from the moment it was written, after a reopen, and now.
    QVERIFY(heldAtOnce);
    QCOMPARE(heldCount, 1);
    QVERIFY(heldReopened);
    QVERIFY(ana.isHeld(draft));
    QCOMPARE(ana.heldCount(), 1);
}

// The proof of an opaque token survives a restart: ana's draft written
// offline with the token her last welcome proved is hers, not held.
void TestDrafts::a_draft_under_a_proven_token_is_not_held_after_a_restart() {
    Fixture f;
    QVERIFY(f.ownedBy(QStringLiteral("ana")));
    Client &ana = f.reopen(QStringLiteral("tok-ana"));
    const QString draft = ana.send(Conv, QStringLiteral("offline, proven token"));
    QVERIFY(!draft.isEmpty());
    QVERIFY(!ana.isHeld(draft));
    QCOMPARE(ana.heldCount(), 0);
    QVERIFY(f.connected());
    QTRY_COMPARE(ana.messageState(draft), MessageState::Sent);
    QCOMPARE(storedSender(f.server, draft), QStringLiteral("ana"));
}

// Defect 2 (client.cpp bindCredential(conn.token())): a fresh store, hello
// under ana's token; while it is in flight the app switches to ben's token
// and ben writes a draft. ana's welcome proves ana's token, not ben's: ben's
// draft is never sent in ana's session.
void TestDrafts::the_session_binds_the_token_its_hello_carried() {
    Fixture f;
    Client &c = f.reopen(QStringLiteral("tok-ana"));
    // ana's own draft goes out in the session ana's hello opens: the resend
    // at its start would carry a wrongly bound draft of ben's with it.
    const QString anas = c.send(Conv, QStringLiteral("ana's draft before the handshake"));
    QVERIFY(!anas.isEmpty());
    QString draft;
    bool switched = false;
    f.server.onFrame = [&](const QJsonObject &frame) {
        if (switched || frame.value(QStringLiteral("t")).toString() != u"hello")
            return;
        switched = true;
        c.setCredentials(QStringLiteral("tok-ben"));
        draft = c.send(Conv, QStringLiteral("ben's draft during ana's handshake"));
    };
    c.connectToServer();
    QTRY_COMPARE(c.connectionState(), ConnectionState::Connected);
    QVERIFY(switched);
    QVERIFY(!draft.isEmpty());
    QCOMPARE(c.userId(), QStringLiteral("ana"));
    QTRY_VERIFY(c.messageState(anas) == MessageState::Sent || sendsOf(f.server, draft) > 0);
    QCOMPARE(sendsOf(f.server, draft), 0);
    QCOMPARE(storedSender(f.server, draft), QString());
    QTRY_COMPARE(c.messageState(anas), MessageState::Sent);
    QCOMPARE(storedSender(f.server, anas), QStringLiteral("ana"));
    QVERIFY(c.isHeld(draft));
}

// Defect 2: a JWT handed over while the hello is in flight is sent as
// `refresh` once the welcome came (else the session runs on the old token
// until it expires).
void TestDrafts::a_jwt_handed_over_during_the_handshake_is_sent_as_refresh() {
    Fixture f;
    const qint64 exp = QDateTime::currentSecsSinceEpoch() + 3600;
    const QString first = FakeServer::jwt(QStringLiteral("ana"), exp);
    const QString second = FakeServer::jwt(QStringLiteral("ana"), exp + 60);
    Client &c = f.reopen(first);
    bool switched = false;
    f.server.onFrame = [&](const QJsonObject &frame) {
        if (!switched && frame.value(QStringLiteral("t")).toString() == u"hello") {
            switched = true;
            c.setCredentials(second);
        }
    };
    c.connectToServer();
    QTRY_COMPARE(c.connectionState(), ConnectionState::Connected);
    QVERIFY(switched);
    QTRY_COMPARE(f.server.requests(QStringLiteral("refresh")).size(), qsizetype(1));
    QCOMPARE(f.server.requests(QStringLiteral("refresh")).first().value(QStringLiteral("token")).toString(), second);
}

// Defect 2: the hello's token is rejected after the app already handed over
// another one: the client does not sit waiting for credentials it has, it
// connects with the newer token.
void TestDrafts::a_rejection_of_a_superseded_token_reconnects_with_the_newer_one() {
    Fixture f;
    Client &c = f.reopen(QStringLiteral("revoked-ana"));
    bool switched = false;
    f.server.onFrame = [&](const QJsonObject &frame) {
        if (!switched && frame.value(QStringLiteral("t")).toString() == u"hello") {
            switched = true;
            c.setCredentials(QStringLiteral("tok-ana"));
        }
    };
    c.connectToServer();
    QTRY_COMPARE(c.connectionState(), ConnectionState::Connected);
    QCOMPARE(c.userId(), QStringLiteral("ana"));
    QVERIFY(!c.isAwaitingCredentials());
}

// Defect 2, close 4001: the session's token expires after the app already
// handed over another (an opaque one is kept for the next hello). The close
// concerns the session's token, not the new one: the client reconnects with
// the new token instead of asking for credentials.
void TestDrafts::an_expiry_close_of_a_replaced_token_reconnects_with_the_new_one() {
    Fixture f;
    Client &c = f.reopen(FakeServer::jwt(QStringLiteral("ana"), QDateTime::currentSecsSinceEpoch() + 3600));
    QVERIFY(f.connected());
    c.setCredentials(QStringLiteral("tok-ana"));
    f.server.closeAllWithCode(4001, QStringLiteral("token expired"));
    QTRY_COMPARE(f.server.requests(QStringLiteral("hello")).size(), qsizetype(2));
    QCOMPARE(f.server.requests(QStringLiteral("hello")).last().value(QStringLiteral("token")).toString(),
             QStringLiteral("tok-ana"));
    QTRY_COMPARE(c.connectionState(), ConnectionState::Connected);
    QVERIFY(!c.isAwaitingCredentials());
}

// Defect 3: on a shared machine ana's token (never accepted) is rejected,
// then ben signs in. ana's draft stays held, ben's session never sends it.
void TestDrafts::drafts_of_a_rejected_token_are_not_carried_to_another_user() {
    Fixture f;
    Client &c = f.reopen(QStringLiteral("revoked-ana"));
    const QString draft = c.send(Conv, QStringLiteral("ana's draft"));
    QVERIFY(!draft.isEmpty());
    QSignalSpy needed(&c, &Client::credentialsNeeded);
    c.connectToServer();
    QTRY_VERIFY(c.isAwaitingCredentials());
    c.setCredentials(QStringLiteral("tok-ben"));
    QTRY_COMPARE(c.connectionState(), ConnectionState::Connected);
    QCOMPARE(c.userId(), QStringLiteral("ben"));
    const QString own = c.send(Conv, QStringLiteral("ben's own"));
    QTRY_COMPARE(c.messageState(own), MessageState::Sent);
    QCOMPARE(storedSender(f.server, own), QStringLiteral("ben"));
    QCOMPARE(sendsOf(f.server, draft), 0);
    QVERIFY(c.isHeld(draft));
}

// Defect 3, the other half: the app says the new token is the same person's
// (im::Client::SameUser): the rejected token's draft goes out under it.
void TestDrafts::same_user_carries_the_rejected_tokens_drafts() {
    Fixture f;
    Client &c = f.reopen(QStringLiteral("revoked-ana"));
    const QString draft = c.send(Conv, QStringLiteral("ana's draft"));
    QVERIFY(!draft.isEmpty());
    c.connectToServer();
    QTRY_VERIFY(c.isAwaitingCredentials());
    c.setCredentials(QStringLiteral("tok-ana"), Client::SameUser);
    QTRY_COMPARE(c.messageState(draft), MessageState::Sent);
    QCOMPARE(storedSender(f.server, draft), QStringLiteral("ana"));
    QCOMPARE(c.heldCount(), 0);
}

// Defect 4: a held draft is visible as held in the timeline model and the
// outbox model (role "held"), next to a pending one that is not; the app
// drops the held ones with discardHeldDrafts().
void TestDrafts::held_drafts_show_as_held_in_both_models_and_can_be_discarded() {
    Fixture f;
    QVERIFY(f.ownedBy(QStringLiteral("ana")));
    Client &c = f.reopen(QStringLiteral("tok-ben"));
    im::MessageListModel timeline(&c, Conv);
    im::OutboxModel outbox(&c);
    QSignalSpy heldSignal(&c, &Client::heldDraftsChanged);
    const QString held = c.send(Conv, QStringLiteral("ben's draft"));
    QVERIFY(!held.isEmpty());
    QCOMPARE(heldSignal.size(), 1);
    QCOMPARE(heldSignal.last().at(0).toInt(), 1);
    c.setCredentials(QStringLiteral("tok-ana"));
    const QString pending = c.send(Conv, QStringLiteral("ana's draft"));
    QVERIFY(!c.isHeld(pending));
    QTRY_COMPARE(timeline.rowCount(), 2);
    QCOMPARE(outbox.rowCount(), 2);
    const auto heldIn = [](const QAbstractItemModel &m, const QString &cmid) -> QVariant {
        for (int r = 0; r < m.rowCount(); ++r) {
            const QVariantMap row = [&] {
                QVariantMap out;
                const QHash<int, QByteArray> names = m.roleNames();
                for (auto it = names.cbegin(); it != names.cend(); ++it)
                    out.insert(QString::fromUtf8(it.value()), m.data(m.index(r, 0), it.key()));
                return out;
            }();
            if (row.value(QStringLiteral("cmid")).toString() == cmid)
                return row.value(QStringLiteral("held"));
        }
        return {};
    };
    QCOMPARE(heldIn(timeline, held), QVariant(true));
    QCOMPARE(heldIn(timeline, pending), QVariant(false));
    QCOMPARE(heldIn(outbox, held), QVariant(true));
    QCOMPARE(heldIn(outbox, pending), QVariant(false));
    const QList<im::OutboxEntry> entries = c.outbox();
    QCOMPARE(entries.size(), 2);
    QVERIFY(entries.at(0).isHeld());
    QVERIFY(!entries.at(1).isHeld());

    QCOMPARE(c.discardHeldDrafts(), 1);
    QCOMPARE(c.heldCount(), 0);
    QCOMPARE(heldSignal.last().at(0).toInt(), 0);
    QCOMPARE(outbox.rowCount(), 1);
    QTRY_COMPARE(timeline.rowCount(), 1);
    QCOMPARE(c.pendingCount(), 1);
    QVERIFY(c.outbox().at(0).cmid() == pending);
    // Nothing held is left to discard; ana's draft goes out as hers.
    QCOMPARE(c.discardHeldDrafts(), 0);
    QVERIFY(f.connected());
    QTRY_COMPARE(c.messageState(pending), MessageState::Sent);
    QCOMPARE(sendsOf(f.server, held), 0);
}

#ifdef IM_SERVER_BIN
// Defect 1 end to end, as seen from outside: a store that belongs to ana
// (she connected once), opened offline with ben's token for one draft, then
// with ana's token again. What the real server stored, seen by fresh stores
// of ana's and ben's: ana's message once, ben's draft never (as anyone).
void TestDrafts::real_server_never_stores_a_draft_as_the_stores_user() {
    RealServer server(exeRelativePath(IM_SERVER_BIN));
    const QString error = server.start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
    QTemporaryDir dir;
    const QString conv = QStringLiteral("ana-ben");
    const auto make = [&](const QString &user, const QString &file) {
        return makeRealClient(server, user, dir.filePath(file));
    };
    {
        auto ana = make(QStringLiteral("ana"), QStringLiteral("owned.db"));
        ana->connectToServer();
        QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
        QCOMPARE(ana->userId(), QStringLiteral("ana"));
    }
    QString draft;
    bool heldAtOnce = false;
    {
        auto ben = make(QStringLiteral("ben"), QStringLiteral("owned.db"));
        draft = ben->send(conv, QStringLiteral("ben's draft in ana's store"));
        QVERIFY(!draft.isEmpty());
        heldAtOnce = ben->isHeld(draft);
    }
    auto ana = make(QStringLiteral("ana"), QStringLiteral("owned.db"));
    ana->connectToServer();
    const QString own = ana->send(conv, QStringLiteral("ana's own"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(own), MessageState::Sent, 60000);

    for (const QString &user : {QStringLiteral("ana"), QStringLiteral("ben")}) {
        auto check = make(user, user + QStringLiteral("-check.db"));
        QSignalSpy synced(check.get(), &Client::conversationSynced);
        check->connectToServer();
        QTRY_VERIFY_WITH_TIMEOUT(std::any_of(synced.cbegin(), synced.cend(),
                                             [&](const QList<QVariant> &a) { return a.at(0).toString() == conv; }),
                                 60000);
        const QString db = check->databasePath();
        const auto count = [&](const QString &body) {
            return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ? AND body = ?"), {conv, body})
                .toLongLong();
        };
        QCOMPARE(count(QStringLiteral("ana's own")), 1);
        QCOMPARE(count(QStringLiteral("ben's draft in ana's store")), 0);
    }
    QCOMPARE(ana->messageState(draft), MessageState::Pending);
    QVERIFY(heldAtOnce);
    QVERIFY(ana->isHeld(draft));
}
#endif

QTEST_GUILESS_MAIN(TestDrafts)
#include "tst_drafts.moc"
