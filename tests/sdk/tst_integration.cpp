// Integration tests against the real imserver (embedded PostgreSQL), started
// by the harness in realserver.h. Demo data: users ana, ben, cy; direct conv
// "ana-ben"; group conv "team" (ana, ben, cy).
#include "exerelative.h"
#include "realserver.h"
#include "sdktestutil.h"

#include <im/client.h>
#include <im/testing.h>

#include <QtCore/QProcess>
#include <QtCore/QRegularExpression>
#include <QtCore/QUuid>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>
#include <QtTest/QtTest>

#include <csignal>
#include <memory>

#ifndef IM_SERVER_BIN
#error "IM_SERVER_BIN must name the imserver executable"
#endif
#ifndef IM_KILLHELPER
#error "IM_KILLHELPER must name the helper executable"
#endif

using im::Client;
using im::ConnectionState;

namespace {

// waitForFinished() returns false for a process that already ended.

QStringList sqlRows(const QString &db, const QString &sql) {
    QStringList out;
    const QString name = QStringLiteral("rows-%1").arg(QUuid::createUuid().toString());
    {
        QSqlDatabase d = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
        d.setDatabaseName(db);
        if (d.open()) {
            QSqlQuery q(d);
            if (q.exec(sql))
                while (q.next())
                    out << q.value(0).toString();
        }
        d.close();
    }
    QSqlDatabase::removeDatabase(name);
    return out;
}


} // namespace

class TestIntegration : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase();
    void two_clients_chat_one_goes_offline_both_converge();
    void killed_sender_leaves_exactly_one_row_per_draft_on_the_server_data();
    void killed_sender_leaves_exactly_one_row_per_draft_on_the_server();
    void sync_killed_mid_page_run_resumes_without_loss_or_duplicates();
    void replies_edits_reactions_converge_on_both_stores();
    void a_burst_over_the_send_rate_lands_exactly_once_after_rate_limited();

private:
    std::unique_ptr<Client> makeClient(const QString &user, const QString &db);
    int serverCount(const QString &conv, const QString &bodyLike);
    // The server's own HTTP port (the WebSocket listener): a sum of the
    // /metrics samples named `name`, and a POST's status (-1: no answer).
    qint64 serverMetric(const QString &name);
    int serverPost(const QString &path, const QByteArray &body);
    QStringList helperArgs(const QString &mode, const QString &user, const QString &db, const QStringList &extra = {});

    std::unique_ptr<RealServer> server_;
    QTemporaryDir dir_;
    QNetworkAccessManager http_;
};

void TestIntegration::initTestCase() {
    server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    server_->serverArgs << QStringLiteral("--enable-faults"); // /lab/fault: the commit held on purpose
    const QString error = server_->start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
}

void TestIntegration::cleanupTestCase() { server_.reset(); }

std::unique_ptr<Client> TestIntegration::makeClient(const QString &user, const QString &db) {
    auto c = std::make_unique<Client>();
    c->setServers({server_->url});
    c->setCredentials(server_->tokens.value(user));
    c->setRequestTimeout(5000);
    c->setReconnectBackoff(100, 1000);
    if (!c->open(db))
        qWarning("open failed: %s", qPrintable(c->lastError()));
    return c;
}

QStringList TestIntegration::helperArgs(const QString &mode, const QString &user, const QString &db,
                                        const QStringList &extra) {
    return QStringList{mode, QStringLiteral("--db"), db, QStringLiteral("--url"), server_->url.toString(),
                       QStringLiteral("--token"), server_->tokens.value(user)} + extra;
}

// Counts, as seen by the server, the msg events of `conv` whose body matches:
// a fresh reader (ben) syncs the whole conversation into a new database.
int TestIntegration::serverCount(const QString &conv, const QString &bodyLike) {
    const QString db = dir_.filePath(QStringLiteral("reader-%1.db").arg(QUuid::createUuid().toString(QUuid::Id128)));
    QProcess reader;
    reader.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("sync"), QStringLiteral("ben"), db,
                                                             {QStringLiteral("--conv"), conv, QStringLiteral("--page"),
                                                              QStringLiteral("200")}));
    if (!reader.waitForStarted() || waitForLine(reader, QStringLiteral("SYNCED ")) != conv)
        return -1;
    finished(reader);
    return sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ? AND kind = 'msg' AND body LIKE ?"),
                     {conv, bodyLike})
        .toInt();
}

qint64 TestIntegration::serverMetric(const QString &name) {
    QUrl url = server_->url;
    url.setScheme(QStringLiteral("http"));
    url.setPath(QStringLiteral("/metrics"));
    std::unique_ptr<QNetworkReply> reply(http_.get(QNetworkRequest(url)));
    if (!QTest::qWaitFor([&] { return reply->isFinished(); }, 10000) || reply->error() != QNetworkReply::NoError)
        return -1;
    const QRegularExpression line(QStringLiteral("^%1(\\{[^}]*\\})? (\\d+)").arg(QRegularExpression::escape(name)),
                                  QRegularExpression::MultilineOption);
    qint64 n = 0;
    for (auto it = line.globalMatch(QString::fromUtf8(reply->readAll())); it.hasNext();)
        n += it.next().captured(2).toLongLong();
    return n;
}

int TestIntegration::serverPost(const QString &path, const QByteArray &body) {
    QUrl url = server_->url;
    url.setScheme(QStringLiteral("http"));
    url.setPath(path);
    QNetworkRequest rq(url);
    rq.setHeader(QNetworkRequest::ContentTypeHeader, QStringLiteral("text/plain"));
    std::unique_ptr<QNetworkReply> reply(http_.post(rq, body));
    if (!QTest::qWaitFor([&] { return reply->isFinished(); }, 10000))
        return -1;
    return reply->attribute(QNetworkRequest::HttpStatusCodeAttribute).toInt();
}

// sdk.md obligation 2 against imserver: a burst over --send-rate/--send-burst
// is answered RATE_LIMITED with retry_ms; the SDK waits and resends with the
// same cmids, so every draft lands exactly once, in order (a server of its
// own: the shared one runs unlimited for the other tests' bursts).
void TestIntegration::a_burst_over_the_send_rate_lands_exactly_once_after_rate_limited() {
    RealServer limited(exeRelativePath(IM_SERVER_BIN));
    limited.serverArgs << QStringLiteral("--send-rate") << QStringLiteral("4") << QStringLiteral("--send-burst")
                       << QStringLiteral("3");
    const QString error = limited.start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
    auto make = [&](const QString &user) {
        auto c = std::make_unique<Client>();
        c->setServers({limited.url});
        c->setCredentials(limited.tokens.value(user));
        c->setRequestTimeout(5000);
        c->setReconnectBackoff(100, 1000);
        if (!c->open(dir_.filePath(QStringLiteral("rl-%1.db").arg(user))))
            qWarning("open failed: %s", qPrintable(c->lastError()));
        return c;
    };
    auto ana = make(QStringLiteral("ana"));
    auto ben = make(QStringLiteral("ben"));
    ana->connectToServer();
    ben->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(ben->connectionState(), ConnectionState::Connected, 20000);
    const QString conv = QStringLiteral("ana-ben");
    QStringList cmids;
    for (int i = 1; i <= 10; ++i)
        cmids << ana->send(conv, QStringLiteral("burst-%1").arg(i));
    QTRY_COMPARE_WITH_TIMEOUT(ana->pendingCount(), 0, 30000);
    for (const QString &cmid : cmids)
        QCOMPARE(ana->messageState(cmid), im::MessageState::Sent);
    const QString benDb = dir_.filePath(QStringLiteral("rl-ben.db"));
    const QString countSql = QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'ana-ben' AND body LIKE 'burst-%'");
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, countSql).toInt(), 10, 20000);
    const QString orderSql = QStringLiteral(
        "SELECT body FROM events WHERE conv = 'ana-ben' AND body LIKE 'burst-%' ORDER BY seq");
    QStringList expected;
    for (int i = 1; i <= 10; ++i)
        expected << QStringLiteral("burst-%1").arg(i);
    QCOMPARE(sqlRows(benDb, orderSql), expected);
    // The limit was met: some sends were answered RATE_LIMITED on the way.
    QUrl url = limited.url;
    url.setScheme(QStringLiteral("http"));
    url.setPath(QStringLiteral("/metrics"));
    std::unique_ptr<QNetworkReply> reply(http_.get(QNetworkRequest(url)));
    QVERIFY(QTest::qWaitFor([&] { return reply->isFinished(); }, 10000));
    const QRegularExpression line(QStringLiteral("^im_writes_rate_limited_total (\\d+)"),
                                  QRegularExpression::MultilineOption);
    const auto m = line.match(QString::fromUtf8(reply->readAll()));
    QVERIFY(m.hasMatch());
    QVERIFY2(m.captured(1).toLongLong() > 0, "no send was rate limited");
}

void TestIntegration::two_clients_chat_one_goes_offline_both_converge() {
    const QString anaDb = dir_.filePath(QStringLiteral("ana.db")), benDb = dir_.filePath(QStringLiteral("ben.db"));
    auto ana = makeClient(QStringLiteral("ana"), anaDb);
    auto ben = makeClient(QStringLiteral("ben"), benDb);
    ana->connectToServer();
    ben->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(ben->connectionState(), ConnectionState::Connected, 20000);
    QCOMPARE(ana->userId(), QStringLiteral("ana"));
    const QString conv = QStringLiteral("ana-ben");
    for (int i = 1; i <= 3; ++i)
        QVERIFY(!ana->send(conv, QStringLiteral("chat-a%1").arg(i)).isEmpty());
    const QString countSql = QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'ana-ben' AND body LIKE 'chat-%'");
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, countSql).toInt(), 3, 20000);

    im::testing::Faults(ben.get()).setOffline(true);
    QCOMPARE(ben->connectionState(), ConnectionState::Disconnected);
    ana->send(conv, QStringLiteral("chat-a4"));
    ana->send(conv, QStringLiteral("chat-a5"));
    ben->send(conv, QStringLiteral("chat-b1"));
    ben->send(conv, QStringLiteral("chat-b2"));
    QCOMPARE(ben->pendingCount(), 2);
    QTRY_COMPARE_WITH_TIMEOUT(ana->pendingCount(), 0, 20000);
    im::testing::Faults(ben.get()).setOffline(false);
    QTRY_COMPARE_WITH_TIMEOUT(ben->pendingCount(), 0, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, countSql).toInt(), 7, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(anaDb, countSql).toInt(), 7, 20000);
    // Messages (join events differ by design: ben may not read ana's join,
    // which precedes his membership period).
    const QString listSql = QStringLiteral(
        "SELECT seq || '|' || sender || '|' || body FROM events WHERE conv = 'ana-ben' AND kind = 'msg' ORDER BY seq");
    QTRY_COMPARE_WITH_TIMEOUT(sqlRows(anaDb, listSql), sqlRows(benDb, listSql), 20000);
    // Own messages are Sent on both sides, nothing left pending.
    QCOMPARE(sqlScalar(anaDb, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE state <> 1")).toInt(), 0);
    QCOMPARE(sqlScalar(benDb, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE state <> 1")).toInt(), 0);
}

// Contract section 12 against imserver (obligation 16): a reply, an edit of
// a message still on its way (by cmid), reactions on and off, and the
// terminal NOT_SENDER; both stores end with the same current body, quote and
// counts, each with its own `me`.
void TestIntegration::replies_edits_reactions_converge_on_both_stores() {
    const QString anaDb = dir_.filePath(QStringLiteral("ana12.db")), benDb = dir_.filePath(QStringLiteral("ben12.db"));
    auto ana = makeClient(QStringLiteral("ana"), anaDb);
    auto ben = makeClient(QStringLiteral("ben"), benDb);
    ana->connectToServer();
    ben->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(ben->connectionState(), ConnectionState::Connected, 20000);
    const QString conv = QStringLiteral("team");
    const QString question = ana->send(conv, QStringLiteral("s12 question, with a typo"));
    const QString fix = ana->edit(conv, question, QStringLiteral("s12 question"));
    QVERIFY(!fix.isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(question), im::MessageState::Sent, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(fix), im::MessageState::Sent, 20000);
    const qint64 qseq = sqlScalar(anaDb, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {question}).toLongLong();
    QVERIFY(qseq > 0);
    const QString seqText = QString::number(qseq);
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'team' AND seq = ?"), {qseq}).toInt(), 1, 20000);

    const QString answer = ben->reply(conv, qseq, QStringLiteral("s12 answer"));
    const QString stolen = ben->edit(conv, qseq, QStringLiteral("not yours"));
    const QString benLike = ben->react(conv, qseq, QStringLiteral("👍"), true);
    const QString anaLike = ana->react(conv, qseq, QStringLiteral("👍"), true);
    const QString anaHeart = ana->react(conv, qseq, QStringLiteral("❤"), true);
    const QString anaHeartOff = ana->react(conv, qseq, QStringLiteral("❤"), false);
    for (const QString &c : {answer, benLike})
        QTRY_COMPARE_WITH_TIMEOUT(ben->messageState(c), im::MessageState::Sent, 20000);
    for (const QString &c : {anaLike, anaHeart, anaHeartOff})
        QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(c), im::MessageState::Sent, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(ben->messageState(stolen), im::MessageState::Failed, 20000);
    QCOMPARE(sqlScalar(benDb, QStringLiteral("SELECT error_code FROM local_messages WHERE cmid = ?"), {stolen}).toString(),
             QStringLiteral("NOT_SENDER"));

    const QString changesSql = QStringLiteral("SELECT COALESCE(edit_body, body) || '|' || COALESCE(reactions, '') FROM events"
                                              " WHERE conv = 'team' AND seq = ") + seqText;
    const QString anaWant = QStringLiteral("s12 question|[{\"count\":2,\"emoji\":\"👍\",\"me\":true}]");
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(anaDb, changesSql).toString(), anaWant, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, changesSql).toString(), anaWant, 20000);
    const QString replySql = QStringLiteral("SELECT reply_to FROM events WHERE conv = 'team' AND kind = 'msg' AND body = 's12 answer'");
    // (By push from the sender's own gateway: imserver's finish_run left
    // reply_to out of that push until this branch.)
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(anaDb, replySql).toLongLong(), qseq, 20000);
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(benDb, replySql).toLongLong(), qseq, 20000);

    // A fresh install of cy reads the message with its changes from pages
    // (no change event needed): same body and counts, `me` false for cy.
    const QString cyDb = dir_.filePath(QStringLiteral("cy12.db"));
    auto cy = makeClient(QStringLiteral("cy"), cyDb);
    cy->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(sqlScalar(cyDb, changesSql).toString(),
                              QStringLiteral("s12 question|[{\"count\":2,\"emoji\":\"👍\",\"me\":false}]"), 30000);
    QCOMPARE(sqlScalar(anaDb, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
    QCOMPARE(sqlScalar(benDb, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
}

void TestIntegration::killed_sender_leaves_exactly_one_row_per_draft_on_the_server_data() {
    QTest::addColumn<bool>("afterCommit");
    QTest::newRow("killed right after send() returned") << false;
    QTest::newRow("killed after the commit, its reply and push never read") << true;
}

// Row 2 makes the case the resend exists for: the server committed the send,
// the sender never read the answer (nor the push of its own event, which
// would settle the draft too), and the process dies. The server holds the
// commit (store.before_commit=delay) while the test stops the sender
// (SIGSTOP) with the send inside the database; the sender is killed once the
// event is committed. The draft must still be pending on disk, and the next
// process's resend (same cmid) must settle it with the one row's seq.
void TestIntegration::killed_sender_leaves_exactly_one_row_per_draft_on_the_server() {
    QFETCH(bool, afterCommit);
    const QString db = dir_.filePath(QStringLiteral("kill-%1.db").arg(afterCommit));
    const QString body = QStringLiteral("kill-%1").arg(QUuid::createUuid().toString(QUuid::Id128));
    const QStringList extra{QStringLiteral("--conv"), QStringLiteral("team"), QStringLiteral("--body"), body};
    const qint64 heldBefore = afterCommit ? serverMetric(QStringLiteral("im_db_pool_in_use")) : 0;
    if (afterCommit)
        QCOMPARE(serverPost(QStringLiteral("/lab/fault"), "store.before_commit=delay:3000:1"), 200);
    QProcess first;
    first.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("send"), QStringLiteral("ana"), db, extra));
    QVERIFY(first.waitForStarted());
    const QString cmid = waitForLine(first, QStringLiteral("CMID ")).value_or(QString());
    QVERIFY(!cmid.isEmpty());
    if (afterCommit) {
        // The send is inside its (held) transaction: stop the sender before
        // the commit, so it reads neither the reply nor the push.
        QTRY_VERIFY_WITH_TIMEOUT(serverMetric(QStringLiteral("im_db_pool_in_use")) > heldBefore, 20000);
        QCOMPARE(::kill(pid_t(first.processId()), SIGSTOP), 0);
        QTRY_COMPARE_WITH_TIMEOUT(serverCount(QStringLiteral("team"), body), 1, 20000);
    }
    first.kill(); // SIGKILL (a stopped process too)
    QVERIFY(finished(first));
    if (afterCommit) {
        // Committed on the server, still pending on disk: never lost, and the
        // resend below is the only way it can settle.
        QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {cmid}).toInt(), 1);
        QVERIFY(sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toInt() != 1);
        QCOMPARE(serverCount(QStringLiteral("team"), body), 1);
    } else {
        // Never lost: still in the outbox, or already confirmed before the kill.
        QVERIFY(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {cmid}).toInt() == 1
                || sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toInt() == 1);
    }

    QProcess second;
    second.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("resend"), QStringLiteral("ana"), db));
    QVERIFY(second.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(second, QStringLiteral("DONE"))), QString());
    QVERIFY(finished(second));
    QCOMPARE(second.exitCode(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 1);
    // Settled with the original's seq, either by the resend's dup:true reply
    // or by syncing its own event (which carries the cmid) first.
    QVERIFY(sqlScalar(db, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmid}).toLongLong() > 0);
    QCOMPARE(serverCount(QStringLiteral("team"), body), 1);
}

void TestIntegration::sync_killed_mid_page_run_resumes_without_loss_or_duplicates() {
    const int total = 300;
    const QString prefix = QStringLiteral("bulk-%1-").arg(QUuid::createUuid().toString(QUuid::Id128));
    auto ana = makeClient(QStringLiteral("ana"), dir_.filePath(QStringLiteral("bulk-ana.db")));
    for (int i = 0; i < total; ++i)
        QVERIFY(!ana->send(QStringLiteral("team"), prefix + QString::number(i)).isEmpty());
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->pendingCount(), 0, 60000);

    const QString db = dir_.filePath(QStringLiteral("cy.db"));
    const QStringList extra{QStringLiteral("--conv"), QStringLiteral("team"), QStringLiteral("--page"), QStringLiteral("20")};
    QProcess first;
    first.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("sync"), QStringLiteral("cy"), db, extra));
    QVERIFY(first.waitForStarted());
    QVERIFY(waitForLine(first, QStringLiteral("PAGE team ")).has_value());
    first.kill();
    QVERIFY(finished(first));
    const qint64 cursor = sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = 'team'")).toLongLong();
    const qint64 stored = sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'team'")).toLongLong();
    const qint64 head = sqlScalar(db, QStringLiteral("SELECT head FROM conversations WHERE conv = 'team'")).toLongLong();
    QVERIFY2(cursor > 0 && cursor < head, qPrintable(QStringLiteral("cursor %1 head %2").arg(cursor).arg(head)));
    QVERIFY(stored <= cursor); // nothing beyond the committed cursor

    QProcess second;
    second.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("sync"), QStringLiteral("cy"), db, extra));
    QVERIFY(second.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(second, QStringLiteral("SYNCED "))), QStringLiteral("team"));
    QVERIFY(finished(second));
    const QString like = prefix + QLatin1Char('%');
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'team' AND body LIKE ?"), {like}).toInt(),
             total);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(DISTINCT body) FROM events WHERE conv = 'team' AND body LIKE ?"),
                       {like})
                 .toInt(),
             total);
    // Gap-free from the first visible seq to the cursor.
    const qint64 finalCursor = sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = 'team'")).toLongLong();
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT MAX(seq) FROM events WHERE conv = 'team'")).toLongLong(), finalCursor);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'team'")).toLongLong(),
             finalCursor - sqlScalar(db, QStringLiteral("SELECT MIN(seq) FROM events WHERE conv = 'team'")).toLongLong() + 1);
}

QTEST_GUILESS_MAIN(TestIntegration)
#include "tst_integration.moc"
