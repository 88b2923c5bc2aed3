// Kill tests against the fake server: a child process calls send() and is
// SIGKILLed (QProcess::kill) at a chosen point; a fresh process on the same
// database resends that message with the same cmid, exactly once.
#include "exerelative.h"
#include "fakeserver.h"
#include "sdktestutil.h"

#include <im/client.h>

#include <QtCore/QProcess>
#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#ifndef IM_KILLHELPER
#error "IM_KILLHELPER must name the helper executable"
#endif

namespace {

// waitForFinished() returns false for a process that already ended.


QStringList helperArgs(const QString &mode, const QString &db, const QUrl &url, const QStringList &extra = {}) {
    return QStringList{mode, QStringLiteral("--db"), db, QStringLiteral("--url"), url.toString(),
                       QStringLiteral("--token"), QStringLiteral("tok-ana")} + extra;
}

} // namespace

class TestKill : public QObject {
    Q_OBJECT
private slots:
    void killed_sender_is_resent_once_with_the_same_cmid_data();
    void killed_sender_is_resent_once_with_the_same_cmid();
    void sync_killed_mid_conversation_resumes_without_loss_or_duplicates();
    void killed_edit_and_reaction_land_once_after_their_target_data();
    void killed_edit_and_reaction_land_once_after_their_target();
    void a_store_is_opened_by_one_process_at_a_time();
};

// Obligation 10: a second process opening a store in use fails at once with
// a clear error (no freeze on SQLite's busy lock, no second writer); once
// the holder died (SIGKILL: no clean unlock), the store opens again.
void TestKill::a_store_is_opened_by_one_process_at_a_time() {
    QTemporaryDir dir;
    const QString db = dir.filePath(QStringLiteral("data/locked.db")); // the folder does not exist yet
    QProcess holder;
    holder.start(exeRelativePath(IM_KILLHELPER), {QStringLiteral("hold"), QStringLiteral("--db"), db});
    QVERIFY(holder.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(holder, QStringLiteral("OPEN"))), QString());

    im::Client second;
    QSignalSpy errors(&second, &im::Client::errorOccurred);
    QSignalSpy typed(&second, &im::Client::errorReported);
    static QStringList categories; // what the SDK logged, by category
    categories.clear();
    const QtMessageHandler previous = qInstallMessageHandler([](QtMsgType, const QMessageLogContext &ctx, const QString &) {
        categories.append(QString::fromUtf8(ctx.category));
    });
    const bool opened = second.open(db);
    qInstallMessageHandler(previous);
    QVERIFY(!opened);
    QVERIFY(!second.isOpen());
    QVERIFY2(second.lastError().contains(QStringLiteral("in use by another process")), qPrintable(second.lastError()));
    QVERIFY2(second.lastError().contains(QString::number(holder.processId())), qPrintable(second.lastError()));
    QCOMPARE(errors.size(), 1);
    QCOMPARE(errors.at(0).at(0).toString(), QStringLiteral("STORE_LOCKED"));
    QCOMPARE(typed.size(), 1); // the same report, typed
    QCOMPARE(typed.at(0).at(0).value<im::Error>(), im::Error::StoreLocked);
    QCOMPARE(im::errorFromCode(QStringLiteral("NOT_MEMBER")), im::Error::NotMember);
    QCOMPARE(im::errorFromCode(QStringLiteral("SOMETHING_NEWER")), im::Error::Unknown);
    QVERIFY2(categories.contains(QStringLiteral("im.sdk.storage")), qPrintable(categories.join(u',')));
    QVERIFY2(categories.contains(QStringLiteral("im.sdk.client")), qPrintable(categories.join(u',')));

    holder.kill(); // SIGKILL: the lock file stays behind, its process is gone
    QVERIFY(finished(holder));
    QVERIFY2(second.open(db), qPrintable(second.lastError()));
    QVERIFY(second.send(QStringLiteral("c1"), QStringLiteral("after the holder died")).size() > 0);
}

void TestKill::killed_sender_is_resent_once_with_the_same_cmid_data() {
    QTest::addColumn<bool>("holdReply");
    QTest::newRow("killed right after send() returned") << false;
    QTest::newRow("killed before the reply is processed") << true;
}

void TestKill::killed_sender_is_resent_once_with_the_same_cmid() {
    QFETCH(bool, holdReply);
    QTemporaryDir dir;
    const QString db = dir.filePath(QStringLiteral("kill.db"));
    FakeServer server;
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    if (holdReply)
        server.holdReplies.insert(QStringLiteral("send"), 1); // processed, answer never leaves

    QProcess first;
    first.start(exeRelativePath(IM_KILLHELPER),
                helperArgs(QStringLiteral("send"), db, server.url(),
                           {QStringLiteral("--conv"), QStringLiteral("c1"), QStringLiteral("--body"),
                            QStringLiteral("draft")}));
    QVERIFY(first.waitForStarted());
    const QString cmid = waitForLine(first, QStringLiteral("CMID ")).value_or(QString());
    QVERIFY2(!cmid.isEmpty(), qPrintable(QString::fromUtf8(first.readAllStandardError())));
    if (holdReply)
        QTRY_COMPARE(server.requests(QStringLiteral("send")).size(), 1);
    first.kill(); // SIGKILL
    QVERIFY(finished(first));
    QCOMPARE(first.exitStatus(), QProcess::CrashExit);

    // Still in the durable outbox of the dead process.
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {cmid}).toInt(), 1);

    QProcess second;
    second.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("resend"), db, server.url()));
    QVERIFY(second.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(second, QStringLiteral("DONE"))), QString());
    QVERIFY(QTest::qWaitFor([&] { return second.state() == QProcess::NotRunning; }, 10000));
    QCOMPARE(second.exitCode(), 0);

    QCOMPARE(server.distinctCmids(), QStringList{cmid});           // one key on the wire
    QCOMPARE(server.convs[QStringLiteral("c1")].head(), 1);         // one event on the server
    QVERIFY(server.requests(QStringLiteral("send")).size() >= (holdReply ? 2 : 1));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 1);
}

void TestKill::sync_killed_mid_conversation_resumes_without_loss_or_duplicates() {
    QTemporaryDir dir;
    const QString db = dir.filePath(QStringLiteral("sync.db"));
    FakeServer server;
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    const int total = 400;
    for (int i = 1; i <= total; ++i)
        server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("m%1").arg(i));

    QProcess first;
    first.start(exeRelativePath(IM_KILLHELPER),
                helperArgs(QStringLiteral("sync"), db, server.url(),
                           {QStringLiteral("--conv"), QStringLiteral("c1"), QStringLiteral("--page"),
                            QStringLiteral("10")}));
    QVERIFY(first.waitForStarted());
    QVERIFY(waitForLine(first, QStringLiteral("PAGE c1 ")).has_value());
    first.kill();
    QVERIFY(finished(first));
    // Everything the dead process sent has been read: the fake saw its
    // connection close. It had usually asked for the page after its cursor
    // already (each committed page starts the next sync), so only the
    // requests from here on are the second process's.
    QTRY_COMPARE(server.openSessions(), 0);
    const int syncsBefore = static_cast<int>(server.requests(QStringLiteral("sync")).size());

    const qint64 cursor =
        sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = 'c1'")).toLongLong();
    const qint64 stored = sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1'")).toLongLong();
    QVERIFY2(cursor >= 10 && cursor < total, qPrintable(QString::number(cursor)));
    // The cursor only covers whole applied pages: exactly the events below it.
    QCOMPARE(stored, cursor);
    // Obligation 18: the search index is written in each page's transaction,
    // so the kill left exactly the stored messages indexed (the bodies are
    // m1..m400: the prefix m finds every indexed one).
    const QString indexed = QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1' AND search_id IS NOT NULL");
    const QString found = QStringLiteral("SELECT COUNT(*) FROM search WHERE search MATCH 'body : m*'");
    QCOMPARE(sqlScalar(db, indexed).toLongLong(), cursor);
    QCOMPARE(sqlScalar(db, found).toLongLong(), cursor);

    QProcess second;
    second.start(exeRelativePath(IM_KILLHELPER),
                 helperArgs(QStringLiteral("sync"), db, server.url(),
                            {QStringLiteral("--conv"), QStringLiteral("c1"), QStringLiteral("--page"),
                             QStringLiteral("50")}));
    QVERIFY(second.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(second, QStringLiteral("SYNCED "))), QStringLiteral("c1"));
    QVERIFY(finished(second));
    // The resumed sync started where the dead one had committed, and never
    // asked for anything below it again.
    const QList<QJsonObject> syncs = server.requests(QStringLiteral("sync"));
    QVERIFY(syncs.size() > syncsBefore);
    QCOMPARE(syncs.at(syncsBefore).value(QStringLiteral("after")).toInteger(), cursor);
    for (int i = syncsBefore; i < syncs.size(); ++i)
        QVERIFY2(syncs.at(i).value(QStringLiteral("after")).toInteger() >= cursor,
                 qPrintable(QStringLiteral("sync %1 after=%2 below the cursor %3")
                                .arg(i)
                                .arg(syncs.at(i).value(QStringLiteral("after")).toInteger())
                                .arg(cursor)));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1'")).toInt(), total);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(DISTINCT body) FROM events WHERE conv = 'c1'")).toInt(), total);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT MAX(seq) - MIN(seq) + 1 FROM events WHERE conv = 'c1'")).toInt(), total);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT after FROM conversations WHERE conv = 'c1'")).toInt(), total);
    QCOMPARE(sqlScalar(db, indexed).toInt(), total);
    QCOMPARE(sqlScalar(db, found).toInt(), total);
}

void TestKill::killed_edit_and_reaction_land_once_after_their_target_data() {
    QTest::addColumn<QString>("held"); // the request type whose reply never leaves the server
    QTest::newRow("killed while the target waits for its reply") << QStringLiteral("send");
    QTest::newRow("killed while the reaction's reply is held") << QStringLiteral("react");
}

// Issue 49 item 4, obligation 16: an edit and a reaction queued behind their
// message, the process SIGKILLed, restarted: each lands exactly once, after
// its target, with its own cmid.
void TestKill::killed_edit_and_reaction_land_once_after_their_target() {
    QFETCH(QString, held);
    QTemporaryDir dir;
    const QString db = dir.filePath(QStringLiteral("changes.db"));
    FakeServer server;
    QVERIFY(server.listen());
    const QString c1 = QStringLiteral("c1");
    server.convs[c1].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    server.holdReplies.insert(held, 1); // processed, the answer never leaves

    QProcess first;
    first.start(exeRelativePath(IM_KILLHELPER),
                helperArgs(QStringLiteral("changes"), db, server.url(),
                           {QStringLiteral("--conv"), c1, QStringLiteral("--body"), QStringLiteral("typo"),
                            QStringLiteral("--timeout"), QStringLiteral("600000")})); // no resend before the kill
    QVERIFY(first.waitForStarted());
    const QStringList cmids = waitForLine(first, QStringLiteral("CMIDS ")).value_or(QString()).split(u' ');
    QCOMPARE(cmids.size(), 3);
    const QString target = cmids.at(0), edit = cmids.at(1), react = cmids.at(2);
    QVERIFY(!target.isEmpty() && !edit.isEmpty() && !react.isEmpty() && edit != target);
    if (held == u"send") {
        QTRY_COMPARE(server.requests(QStringLiteral("send")).size(), 1);
    } else {
        // The edit went and was answered; the reaction (after it: changes
        // go one at a time) is on the server, its answer held.
        QTRY_COMPARE(server.requests(QStringLiteral("react")).size(), 1);
        QCOMPARE(server.requests(QStringLiteral("edit")).size(), 1);
    }
    first.kill(); // SIGKILL
    QVERIFY(finished(first));
    QCOMPARE(first.exitStatus(), QProcess::CrashExit);
    // Still in the dead process's durable outbox: both changes (the target
    // unanswered), or the reaction.
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid IN (?, ?)"), {edit, react}).toInt(),
             held == u"send" ? 2 : 1);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox WHERE cmid = ?"), {react}).toInt(), 1);
    if (held == u"send") // nothing of them went out: the target had no seq
        QCOMPARE(server.requests(QStringLiteral("edit")).size() + server.requests(QStringLiteral("react")).size(), 0);

    QProcess second;
    second.start(exeRelativePath(IM_KILLHELPER), helperArgs(QStringLiteral("resend"), db, server.url()));
    QVERIFY(second.waitForStarted());
    QCOMPARE(lineOrNone(waitForLine(second, QStringLiteral("DONE"))), QString());
    QVERIFY(finished(second));
    QCOMPARE(second.exitCode(), 0);

    // Exactly one message, one edit and one reaction event on the server,
    // the changes above their target and naming it.
    const FakeServer::Conv &c = server.convs[c1];
    QStringList kinds;
    qint64 targetSeq = 0;
    for (const QJsonObject &e : c.events) {
        kinds << e.value(QStringLiteral("kind")).toString();
        if (e.value(QStringLiteral("kind")).toString() == u"msg")
            targetSeq = e.value(QStringLiteral("seq")).toInteger();
        else
            QCOMPARE(e.value(QStringLiteral("target")).toInteger(), targetSeq);
    }
    QCOMPARE(kinds, (QStringList{QStringLiteral("msg"), QStringLiteral("edit"), QStringLiteral("reaction")}));
    for (const QJsonObject &o : server.requests(QStringLiteral("edit")))
        QCOMPARE(o.value(QStringLiteral("cmid")).toString(), edit);
    for (const QJsonObject &o : server.requests(QStringLiteral("react")))
        QCOMPARE(o.value(QStringLiteral("cmid")).toString(), react);
    QCOMPARE(server.distinctCmids(), QStringList{target});
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM outbox")).toInt(), 0);
    for (const QString &cmid : cmids)
        QCOMPARE(sqlScalar(db, QStringLiteral("SELECT state FROM local_messages WHERE cmid = ?"), {cmid}).toInt(), 1);
}

QTEST_GUILESS_MAIN(TestKill)
#include "tst_kill.moc"
