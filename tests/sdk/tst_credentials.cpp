// Obligation 14 (spec sdk.md, contract section 4a): tokens that expire.
// im::Client against the in-process fake server speaking token_expiring,
// refresh -> refreshed, close code 4001 and UNAUTHENTICATED.
#include "fakeserver.h"
#include "sdktestutil.h"

#include <im/client.h>

#include <QtCore/QDateTime>
#include <QtCore/QSet>
#include <QtCore/QTemporaryDir>
#include <QtTest/QtTest>

using im::Client;
using im::ConnectionState;
using im::MessageState;
using Reason = im::Client::CredentialsReason;

namespace {

qint64 nowSecs() { return QDateTime::currentSecsSinceEpoch(); }

struct Fixture {
    QTemporaryDir dir;
    FakeServer server;
    Client client;
    QString db;
    QSignalSpy needed{&client, &Client::credentialsNeeded};
    QList<MessageState> states; // every state any message went through
    QHash<QString, MessageState> last; // each cmid's latest state, as signalled

    explicit Fixture(const QString &token) {
        server.listen();
        server.eventsCarryCmid = true;
        server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        client.setServers({server.url()});
        client.setCredentials(token);
        client.setRequestTimeout(2000);
        client.setRetryBackoff(40, 300);
        client.setReconnectBackoff(40, 200);
        db = dir.filePath(QStringLiteral("client.db"));
        QObject::connect(&client, &Client::messageStateChanged, &client,
                         [this](const QString &, const QString &cmid, qint64, MessageState s, const QString &) {
                             states.append(s);
                             last.insert(cmid, s);
                         });
    }
    bool open() { return client.open(db); }
    bool openAndConnect() {
        if (!open())
            return false;
        client.connectToServer();
        return QTest::qWaitFor([this] { return client.connectionState() == ConnectionState::Connected; }, 5000);
    }
    Reason reason(qsizetype i) const { return needed.at(i).at(0).value<Reason>(); }
    int count(const QString &t) const { return int(server.requests(t).size()); }
    // How many events of c1 carry each cmid (the server's record of delivery).
    QHash<QString, int> eventsPerCmid() const {
        QHash<QString, int> n;
        for (const QJsonObject &e : server.convs.value(QStringLiteral("c1")).events)
            if (e.value(QStringLiteral("kind")).toString() == u"msg")
                ++n[e.value(QStringLiteral("cmid")).toString()];
        return n;
    }
    // Each cmid stored exactly once by the server, the outbox empty, and no
    // message ever shown Failed.
    bool deliveredOnceNoneFailed(const QStringList &cmids) const {
        const QHash<QString, int> stored = eventsPerCmid();
        const bool once = stored.size() == cmids.size()
                          && std::all_of(cmids.cbegin(), cmids.cend(), [&](const QString &c) { return stored.value(c) == 1; });
        if (!once)
            qWarning("stored %lld distinct cmids for %lld sent", qint64(stored.size()), qint64(cmids.size()));
        return once && !states.contains(MessageState::Failed) && client.pendingCount() == 0;
    }
    // Polled by QTRY: the outbox empty and every cmid signalled Sent (both in
    // memory: messageState() reads the store, a query per cmid, which on a
    // loaded machine made each poll of 1000 cmids take minutes). The store's
    // answer is checked once at the end (storedStatesSent).
    bool allSent(const QStringList &cmids) const {
        if (client.pendingCount() != 0)
            return false;
        return std::all_of(cmids.cbegin(), cmids.cend(),
                           [this](const QString &c) { return last.value(c) == MessageState::Sent; });
    }
    // The store agrees, on every 25th cmid (messageState() reads the
    // conversation's rows from that message on: quadratic over all 1000).
    bool storedStatesSent(const QStringList &cmids) const {
        for (qsizetype i = 0; i < cmids.size(); i += 25)
            if (client.messageState(cmids.at(i)) != MessageState::Sent)
                return false;
        return client.messageState(cmids.constLast()) == MessageState::Sent;
    }
};

} // namespace

class TestCredentials : public QObject {
    Q_OBJECT
private slots:
    void token_expiring_asks_for_a_token_and_refresh_keeps_the_connection();
    void a_jwt_close_to_its_exp_is_asked_about_before_the_server_pushes();
    void close_4001_asks_again_waits_without_reconnecting_then_uses_the_new_token();
    void unauthenticated_hello_is_rejected_and_the_outbox_stays_pending();
    void a_refresh_refused_by_the_server_is_a_rejection();
    void a_token_expiring_under_a_1000_entry_backlog_is_refreshed_and_each_entry_delivered_once();
    void a_token_expiring_unrefreshed_under_a_backlog_loses_and_doubles_nothing();
};

void TestCredentials::token_expiring_asks_for_a_token_and_refresh_keeps_the_connection() {
    Fixture f(FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 3600));
    QVERIFY(f.openAndConnect());
    QCOMPARE(f.needed.size(), 0);
    QSignalSpy expiry(&f.client, &Client::tokenExpiresAtChanged);

    const qint64 exp = QDateTime::currentMSecsSinceEpoch() + 60000;
    f.server.pushTokenExpiring(exp);
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Expiring);
    QVERIFY(expiry.size() >= 1);
    // The server's clock is ours here: the expiry shown is the pushed one.
    QVERIFY(qAbs(f.client.tokenExpiresAt().toMSecsSinceEpoch() - exp) < 2000);

    const QString fresh = FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 7200);
    f.server.refreshedExpMs = (nowSecs() + 7200) * 1000;
    f.client.setCredentials(fresh);
    QTRY_COMPARE(f.count(QStringLiteral("refresh")), 1);
    QCOMPARE(f.server.requests(QStringLiteral("refresh")).first().value(QStringLiteral("token")).toString(), fresh);
    // (less the server's clock skew measured at welcome: a few ms here)
    QTRY_VERIFY(qAbs(f.client.tokenExpiresAt().toMSecsSinceEpoch() - f.server.refreshedExpMs) < 2000);

    // Still the same connection, and it works.
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("after refresh"));
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.count(QStringLiteral("hello")), 1);
    QCOMPARE(f.client.connectionState(), ConnectionState::Connected);
    QCOMPARE(f.needed.size(), 1);
    QVERIFY(!f.client.isAwaitingCredentials());

    // A later reconnect says hello with the new token.
    f.server.closeAll();
    QTRY_COMPARE(f.count(QStringLiteral("hello")), 2);
    QCOMPARE(f.server.requests(QStringLiteral("hello")).last().value(QStringLiteral("token")).toString(), fresh);
}

void TestCredentials::a_jwt_close_to_its_exp_is_asked_about_before_the_server_pushes() {
    const qint64 expSecs = nowSecs() + 30;
    Fixture f(FakeServer::jwt(QStringLiteral("ana"), expSecs));
    QCOMPARE(f.client.tokenExpiresAt().toSecsSinceEpoch(), expSecs);
    QVERIFY(f.openAndConnect());
    // Less than 90 s left: asked at once, once, with no push from the server.
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Expiring);
    f.server.pushTokenExpiring(expSecs * 1000);
    // A barrier, not a sleep: the reply to this send comes after the push on
    // the same connection, so once it is Sent the push has been handled.
    const QString barrier = f.client.send(QStringLiteral("c1"), QStringLiteral("after the push"));
    QTRY_COMPARE(f.client.messageState(barrier), MessageState::Sent);
    QCOMPARE(f.needed.size(), 1); // the push names what was asked already
    QCOMPARE(Fixture(QStringLiteral("tok-ana")).client.tokenExpiresAt(), QDateTime()); // not a JWT: unknown
}

void TestCredentials::close_4001_asks_again_waits_without_reconnecting_then_uses_the_new_token() {
    const QString old = FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 3600);
    Fixture f(old);
    QVERIFY(f.openAndConnect());
    QSignalSpy typed(&f.client, &Client::errorReported);

    f.server.rejectedTokens.insert(old); // what the real server does past exp
    f.server.closeAllWithCode(4001, QStringLiteral("token expired"));
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Rejected);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    QVERIFY(f.client.isAwaitingCredentials());
    QVERIFY(std::any_of(typed.cbegin(), typed.cend(), [](const QList<QVariant> &a) {
        return a.at(0).value<im::Error>() == im::Error::Unauthenticated;
    }));
    // Messages written meanwhile wait, Pending.
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("written while signed out"));
    // No reconnect storm with the bad token: over many reconnect backoffs
    // (40-200 ms) not one hello.
    QTest::qWait(1000);
    QCOMPARE(f.count(QStringLiteral("hello")), 1);
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.client.messageState(cmid), MessageState::Pending);
    // An app that calls connectToServer() again is asked again; still no hello.
    f.client.connectToServer();
    QCOMPARE(f.needed.size(), 2);
    QCOMPARE(f.reason(1), Reason::Rejected);
    QTest::qWait(300);
    QCOMPARE(f.count(QStringLiteral("hello")), 1);

    const QString fresh = FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 7200);
    f.client.setCredentials(fresh);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    QCOMPARE(f.count(QStringLiteral("hello")), 2);
    QCOMPARE(f.server.requests(QStringLiteral("hello")).last().value(QStringLiteral("token")).toString(), fresh);
    QVERIFY(!f.client.isAwaitingCredentials());
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QVERIFY(!f.states.contains(MessageState::Failed));
}

void TestCredentials::unauthenticated_hello_is_rejected_and_the_outbox_stays_pending() {
    Fixture f(QStringLiteral("revoked-token"));
    QVERIFY(f.open());
    QStringList cmids;
    for (int i = 0; i < 3; ++i)
        cmids.append(f.client.send(QStringLiteral("c1"), QStringLiteral("draft %1").arg(i)));
    f.client.connectToServer();
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Rejected);
    QTest::qWait(1000); // many reconnect backoffs: none is tried
    QCOMPARE(f.count(QStringLiteral("hello")), 1);
    QCOMPARE(f.count(QStringLiteral("send")), 0);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    QCOMPARE(f.client.pendingCount(), 3);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 3);
    for (const QString &c : cmids)
        QCOMPARE(f.client.messageState(c), MessageState::Pending);

    // The same person signed in again (obligation 10, issue 48: without
    // SameUser the rejected token's drafts stay held, see tst_drafts).
    f.client.setCredentials(QStringLiteral("tok-ana"), Client::SameUser);
    QTRY_VERIFY(f.allSent(cmids));
    QCOMPARE(f.count(QStringLiteral("hello")), 2);
    QCOMPARE(f.server.distinctCmids(), cmids);
    QVERIFY(!f.states.contains(MessageState::Failed));
}

void TestCredentials::a_refresh_refused_by_the_server_is_a_rejection() {
    Fixture f(FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 3600));
    QVERIFY(f.openAndConnect());
    // A token of another user cannot take over this connection.
    f.client.setCredentials(FakeServer::jwt(QStringLiteral("ben"), nowSecs() + 3600));
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Rejected);
    QCOMPARE(f.count(QStringLiteral("refresh")), 1);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    QVERIFY(f.client.isAwaitingCredentials());
    QTest::qWait(500);
    QCOMPARE(f.count(QStringLiteral("hello")), 1);
}

void TestCredentials::a_token_expiring_under_a_1000_entry_backlog_is_refreshed_and_each_entry_delivered_once() {
    Fixture f(FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 3600));
    f.client.setRequestTimeout(60000); // so that any resend would be the refresh's doing
    QVERIFY(f.open());
    QStringList cmids;
    for (int i = 0; i < 1000; ++i)
        cmids.append(f.client.send(QStringLiteral("c1"), QStringLiteral("backlog %1").arg(i)));
    QVERIFY(!cmids.contains(QString()));
    // The app's handler: a fresh token from its backend.
    QObject::connect(&f.client, &Client::credentialsNeeded, &f.client, [&f](Reason) {
        f.client.setCredentials(FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 7200));
    });
    int sends = 0;
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == u"send" && ++sends == 300)
            f.server.pushTokenExpiring(QDateTime::currentMSecsSinceEpoch() + 60000);
    };
    f.client.connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(f.allSent(cmids), 60000);
    QCOMPARE(f.needed.size(), 1);
    QCOMPARE(f.count(QStringLiteral("refresh")), 1);
    QCOMPARE(f.server.connections, 1);
    // Exactly once: every cmid went on the wire once and is stored once.
    QCOMPARE(f.count(QStringLiteral("send")), 1000);
    QCOMPARE(f.server.distinctCmids(), cmids); // each once, in the order they were written
    QVERIFY(f.deliveredOnceNoneFailed(cmids));
    QVERIFY(f.storedStatesSent(cmids));
}

void TestCredentials::a_token_expiring_unrefreshed_under_a_backlog_loses_and_doubles_nothing() {
    const QString old = FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 3600);
    Fixture f(old);
    // The close, not a timeout, must bring the entries on the wire back: a
    // 2 s timeout under a loaded machine re-sends what is merely slow, and
    // the backlog then crawls through timeouts and back-offs.
    f.client.setRequestTimeout(60000);
    QVERIFY(f.open());
    QStringList cmids;
    for (int i = 0; i < 1000; ++i)
        cmids.append(f.client.send(QStringLiteral("c1"), QStringLiteral("backlog %1").arg(i)));
    int sends = 0;
    f.server.onFrame = [&](const QJsonObject &req) {
        if (req.value(QStringLiteral("t")).toString() == u"send" && ++sends == 300) {
            // exp reached with requests on the wire: the server closes 4001.
            f.server.rejectedTokens.insert(old);
            f.server.closeAllWithCode(4001, QStringLiteral("token expired"));
        }
    };
    f.client.connectToServer();
    QTRY_COMPARE(f.needed.size(), 1);
    QCOMPARE(f.reason(0), Reason::Rejected);
    QVERIFY(f.client.pendingCount() > 0);
    QCOMPARE(f.count(QStringLiteral("hello")), 1);
    // Another exp than the old token's: made within the same second, the
    // same claims would sign to the very token the server rejects.
    f.client.setCredentials(FakeServer::jwt(QStringLiteral("ana"), nowSecs() + 7200));
    // The requests on the wire at the close are resent after the new hello.
    QTRY_VERIFY_WITH_TIMEOUT(f.allSent(cmids), 120000);
    QCOMPARE(f.count(QStringLiteral("hello")), 2);
    QVERIFY(f.deliveredOnceNoneFailed(cmids));
    QVERIFY(f.storedStatesSent(cmids));
}

QTEST_GUILESS_MAIN(TestCredentials)
#include "tst_credentials.moc"
