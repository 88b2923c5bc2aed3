// im::Client against an in-process fake server (tst_client_fixture.h):
// sessions and the store: server URLs, goaway and reconnect, installs and STALE_INSTALL, the
// credential a draft was written under, the SQLite file (WAL, FULL, schema version), the QA hooks,
// the socket.
// One test per obligation of docs/sdk.md / spec sdk.md, each written so
// that breaking the obligation it names makes it fail.
#include "client_p.h"
#include "fakeserver.h"
#include "sdktestutil.h"
#include "tst_client_fixture.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>
#include <im/testing.h>

#include <QtCore/QElapsedTimer>
#include <QtCore/QJsonArray>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUuid>
#include <QtNetwork/QTcpServer>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>
#include <QtTest/QtTest>

class TestClientSession : public QObject {
    Q_OBJECT
private slots:
    void goaway_reconnects_to_the_next_server_url();
    void reconnect_rotates_through_urls_with_backoff();
    void stale_install_on_hello_is_reported_and_stops_the_client();
    void stale_install_on_ack_is_reported();
    void install_id_is_generated_once_and_sent_in_hello();
    void database_is_wal_synchronous_full_with_a_schema_version();
    void newer_schema_version_is_refused();
    void qa_hooks_go_offline_drop_a_reply_and_close_the_socket();
    void socket_has_no_nagle_delay();
    void a_draft_written_under_another_users_token_is_never_sent();
    void a_draft_names_the_credential_it_was_written_under();
};

void TestClientSession::goaway_reconnects_to_the_next_server_url() {
    Fixture f;
    FakeServer second;
    QVERIFY(second.listen());
    second.convs = f.server.convs;
    f.client.setServers({f.server.url(), second.url()});
    QVERIFY(f.openAndConnect());
    QCOMPARE(f.client.currentServer(), f.server.url());
    QTRY_COMPARE(f.server.subscribedCount(), 1);
    f.server.pushToAll({{QStringLiteral("t"), QStringLiteral("goaway")}, {QStringLiteral("reason"), QStringLiteral("shutdown")}});
    QTRY_COMPARE(second.connections, 1);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    QCOMPARE(f.client.currentServer(), second.url());
    QCOMPARE(f.server.connections, 1);
    const QString cmid = f.client.send(QStringLiteral("c1"), QStringLiteral("via second"));
    QTRY_COMPARE(f.client.messageState(cmid), MessageState::Sent);
    QCOMPARE(second.distinctCmids(), QStringList{cmid});
}

void TestClientSession::reconnect_rotates_through_urls_with_backoff() {
    Fixture f;
    // A port nobody listens on.
    QTcpServer probe;
    QVERIFY(probe.listen(QHostAddress::LocalHost, 0));
    const QUrl dead(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(probe.serverPort()));
    probe.close();
    f.client.setServers({dead, f.server.url()});
    f.client.setReconnectBackoff(200, 400);
    QVERIFY(f.client.open(f.db));
    QSignalSpy states(&f.client, &Client::connectionStateChanged);
    QDateTime nextAttempt;
    connect(&f.client, &Client::connectionStateChanged, &f.client, [&](ConnectionState s) {
        if (s == ConnectionState::Reconnecting && !nextAttempt.isValid())
            nextAttempt = f.client.nextReconnectAt();
    });
    QElapsedTimer clock;
    clock.start();
    f.client.connectToServer();
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
    QVERIFY(clock.elapsed() >= 100); // waited at least the jittered first backoff
    QVERIFY(nextAttempt.isValid());
    QCOMPARE(states.first().at(0).value<ConnectionState>(), ConnectionState::Connecting);
    bool sawReconnecting = false;
    for (const auto &s : states)
        sawReconnecting = sawReconnecting || s.at(0).value<ConnectionState>() == ConnectionState::Reconnecting;
    QVERIFY(sawReconnecting);
    QCOMPARE(f.client.currentServer(), f.server.url());
}

void TestClientSession::stale_install_on_hello_is_reported_and_stops_the_client() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    const QString draft = f.client.send(QStringLiteral("c1"), QStringLiteral("kept"));
    f.server.staleInstalls.insert(f.client.installId());
    QSignalSpy stale(&f.client, &Client::installStaleChanged);
    QSignalSpy errors(&f.client, &Client::errorOccurred);
    f.client.connectToServer();
    QTRY_COMPARE(stale.size(), 1);
    QVERIFY(f.client.isInstallStale());
    QCOMPARE(errors.last().at(0).toString(), QStringLiteral("STALE_INSTALL"));
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    // No reconnect loop on a stale install: the transport is stopped, with no
    // attempt scheduled. Every reconnect (after a loss, after a backoff) is
    // an attempt of a running transport, and only connectToServer() (refused
    // while stale) or coming back online (likewise) starts it again. The
    // public state alone would not show it: a transport that goes on waiting
    // for its next attempt still reads Disconnected here.
    const im::detail::Transport *transport = im::ClientPrivate::get(&f.client)->conn.transport();
    QVERIFY(!transport->isRunning());
    QCOMPARE(transport->state(), im::detail::Transport::State::Idle);
    QVERIFY(!transport->nextAttemptAt().isValid());
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.client.pendingCount(), 1);
    // Remembered across restarts (one Client at a time has the store open).
    f.client.close();
    {
        Client again;
        QVERIFY(again.open(f.dir.filePath(QStringLiteral("client.db"))));
        QVERIFY(again.isInstallStale());
    }
    QVERIFY(f.client.open(f.db));
    // The app decides to reset: new install id, outbox kept and delivered.
    const QString oldId = f.client.installId();
    QVERIFY(f.client.resetInstall());
    QVERIFY(f.client.installId() != oldId);
    QVERIFY(!f.client.isInstallStale());
    f.client.connectToServer();
    QTRY_COMPARE(f.client.messageState(draft), MessageState::Sent);
}

void TestClientSession::stale_install_on_ack_is_reported() {
    Fixture f;
    f.server.failWith.insert(QStringLiteral("ack"), QStringLiteral("STALE_INSTALL"));
    f.server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("b1"));
    QSignalSpy stale(&f.client, &Client::installStaleChanged);
    QVERIFY(f.openAndConnect());
    QTRY_COMPARE(stale.size(), 1);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
}

void TestClientSession::install_id_is_generated_once_and_sent_in_hello() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    const QString id = f.client.installId();
    QCOMPARE(QUuid::fromString(id).version(), QUuid::Random);
    QCOMPARE(f.server.requests(QStringLiteral("hello")).first().value(QStringLiteral("install")).toString(), id);
    f.client.close();
    Client second;
    QVERIFY(second.open(f.db));
    QCOMPARE(second.installId(), id);
    QTemporaryDir other;
    Client third;
    QVERIFY(third.open(other.filePath(QStringLiteral("x.db"))));
    QVERIFY(third.installId() != id);
}

void TestClientSession::database_is_wal_synchronous_full_with_a_schema_version() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    auto &storage = im::ClientPrivate::get(&f.client)->storage;
    QCOMPARE(storage.pragma(QStringLiteral("journal_mode")), QStringLiteral("wal"));
    QCOMPARE(storage.pragma(QStringLiteral("synchronous")), QStringLiteral("2")); // FULL
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT MAX(version) FROM schema_version")).toInt(),
             im::detail::Storage::SchemaVersion);
    f.client.close();
    QVERIFY(f.client.open(f.db)); // reopening an up-to-date database migrates nothing
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM schema_version")).toInt(),
             im::detail::Storage::SchemaVersion);
}

void TestClientSession::newer_schema_version_is_refused() {
    Fixture f;
    QVERIFY(f.client.open(f.db));
    f.client.close();
    sqlScalar(f.db, QStringLiteral("INSERT INTO schema_version(version, applied_at) VALUES(99, 0) RETURNING version"));
    QVERIFY(!f.client.open(f.db));
    QVERIFY(f.client.lastError().contains(QStringLiteral("newer")));
}

void TestClientSession::qa_hooks_go_offline_drop_a_reply_and_close_the_socket() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    im::testing::Faults faults(&f.client);
    im::testing::Faults other(&f.client); // a second panel on the same client
    QSignalSpy offlineSpy(&other, &im::testing::Faults::offlineChanged);
    faults.setOffline(true);
    QVERIFY(other.isOffline());
    QCOMPARE(offlineSpy.size(), 1);
    QCOMPARE(offlineSpy.at(0).at(0).toBool(), true);
    QCOMPARE(f.client.connectionState(), ConnectionState::Disconnected);
    const QString queued = f.client.send(QStringLiteral("c1"), QStringLiteral("while offline"));
    // Offline means no reconnect: the transport is stopped, with no attempt
    // scheduled (a reconnect is an attempt of a running transport; only
    // setOffline(false) starts it again). The public state would read
    // Disconnected even for a transport waiting to reconnect.
    const im::detail::Transport *transport = im::ClientPrivate::get(&f.client)->conn.transport();
    QVERIFY(!transport->isRunning());
    QCOMPARE(transport->state(), im::detail::Transport::State::Idle);
    QVERIFY(!transport->nextAttemptAt().isValid());
    QCOMPARE(f.server.connections, 1);
    QCOMPARE(f.requestsOf(QStringLiteral("send")), 0);
    faults.setOffline(false);
    QVERIFY(!other.isOffline());
    QCOMPARE(offlineSpy.size(), 2);
    QTRY_COMPARE(f.client.messageState(queued), MessageState::Sent);
    // dropNextReply: the reply is ignored, the request is retried (same cmid).
    // It drops the next reply of any request, so first the ack of the first
    // message must have its answer: the client records `delivered` from the
    // `acked` reply (the ack goes out after the event is applied, debounced).
    QTRY_COMPARE(f.cursor(QStringLiteral("c1")), 1);
    QTRY_COMPARE(sqlScalar(f.db, QStringLiteral("SELECT delivered FROM conversations WHERE conv = 'c1'")).toLongLong(), 1);
    f.client.setRequestTimeout(kLostReplyTimeoutMs); // what resends the request whose reply was dropped
    faults.dropNextReply();
    const QString dropped = f.client.send(QStringLiteral("c1"), QStringLiteral("reply dropped"));
    QTRY_COMPARE_WITH_TIMEOUT(f.client.messageState(dropped), MessageState::Sent, 5000);
    QCOMPARE(f.server.distinctCmids().count(dropped), 1);
    // Sent again with its cmid: twice at least (once more when the resend's
    // own answer came after the timeout on a loaded machine); the one queued
    // offline went once.
    int sendsOfDropped = 0;
    for (const QJsonObject &o : f.server.requests(QStringLiteral("send")))
        sendsOfDropped += o.value(QStringLiteral("cmid")).toString() == dropped ? 1 : 0;
    QVERIFY2(sendsOfDropped >= 2, qPrintable(QStringLiteral("%1 sends of the dropped one").arg(sendsOfDropped)));
    QCOMPARE(f.requestsOf(QStringLiteral("send")) - sendsOfDropped, 1);
    // closeSocketNow: reconnects by itself.
    const int conns = f.server.connections;
    faults.closeSocketNow();
    QTRY_COMPARE(f.server.connections, conns + 1);
    QTRY_COMPARE(f.client.connectionState(), ConnectionState::Connected);
}

// Small request/reply frames must not wait for a delayed ACK (issue 10).
void TestClientSession::socket_has_no_nagle_delay() {
    Fixture f;
    QVERIFY(f.openAndConnect());
    const QVariant v = im::ClientPrivate::get(&f.client)->conn.transport()->socketOption(QAbstractSocket::LowDelayOption);
    QVERIFY(v.isValid());
    QCOMPARE(v.toInt(), 1);
}

// Issue 26 item 13. A store used offline first: ana's draft, written under
// her token before the store ever met the server. Opened next with ben's
// token, the store becomes ben's; ana's draft never goes out as ben.
void TestClientSession::a_draft_written_under_another_users_token_is_never_sent() {
    QTemporaryDir dir;
    FakeServer server;
    QVERIFY(server.listen());
    const QString c1 = QStringLiteral("c1");
    server.convs[c1].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    const QString db = dir.filePath(QStringLiteral("shared.db"));
    QString draft;
    {
        Client ana;
        ana.setServers({server.url()});
        ana.setCredentials(QStringLiteral("tok-ana"));
        QVERIFY(ana.open(db));
        draft = ana.send(c1, QStringLiteral("ana's draft"));
        QVERIFY(!draft.isEmpty());
    }
    Client ben;
    ben.setServers({server.url()});
    ben.setCredentials(QStringLiteral("tok-ben"));
    QStringList codes;
    connect(&ben, &Client::errorOccurred, this, [&](const QString &code, const QString &) { codes.append(code); });
    QVERIFY(ben.open(db));
    ben.connectToServer();
    QTRY_COMPARE(ben.connectionState(), ConnectionState::Connected);
    const QString own = ben.send(c1, QStringLiteral("ben's own"));
    QTRY_COMPARE(ben.messageState(own), MessageState::Sent);
    for (const QJsonObject &req : server.requests(QStringLiteral("send")))
        QVERIFY(req.value(QStringLiteral("cmid")).toString() != draft);
    QCOMPARE(server.convs[c1].head(), 1);
    QCOMPARE(ben.messageState(draft), MessageState::Pending);
    // Held, and said so with its own code: the session was not refused.
    QVERIFY(codes.contains(QStringLiteral("DRAFTS_HELD")));
    QVERIFY(!codes.contains(QStringLiteral("WRONG_USER")));
    QVERIFY(ben.cancel(draft)); // never sent: it can be dropped
}

void TestClientSession::a_draft_names_the_credential_it_was_written_under() {
    using im::Outbox;
    const auto b64 = [](const QByteArray &s) {
        return QString::fromLatin1(s.toBase64(QByteArray::Base64UrlEncoding | QByteArray::OmitTrailingEquals));
    };
    const QString jwt = b64(R"({"alg":"EdDSA","typ":"JWT"})") + u'.' + b64(R"({"sub":"ana","exp":4102444800})")
                        + QStringLiteral(".c2ln");
    QCOMPARE(Outbox::credentialOf(jwt), QStringLiteral("user:ana"));
    const QString opaque = Outbox::credentialOf(QStringLiteral("tok-ana"));
    QVERIFY(opaque.startsWith(QStringLiteral("token:")));
    QCOMPARE(opaque.size(), 6 + 64);
    QVERIFY(opaque != Outbox::credentialOf(QStringLiteral("tok-ben")));
    QVERIFY(!opaque.contains(QStringLiteral("tok-ana"))); // a fingerprint, not the secret
    QCOMPARE(Outbox::credentialOf(QString()), QString());
}

QTEST_GUILESS_MAIN(TestClientSession)
#include "tst_client_session.moc"
