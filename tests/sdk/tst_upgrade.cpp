// Issue 48: a store written by an older SDK opens with this one and keeps
// everything. tests/sdk/fixtures/store-v<N>.sql is a store as each released
// schema version left it (written by make_store_fixtures.py from that
// version's released DDL, not from the SDK's code): pending drafts (one tried
// twice), our own sent message, events, cursors and markers, a trimmed gap
// and a history-window gap, the install's identity. A migration that drops
// or rewrites any of it fails here.
#include "fakeserver.h"
#include "sdktestutil.h"
#include "storage_p.h"

#include <im/client.h>

#include <QtCore/QFile>
#include <QtCore/QTemporaryDir>
#include <QtSql/QSqlError>
#include <QtTest/QtTest>

#ifndef IM_STORE_FIXTURES
#error "IM_STORE_FIXTURES must name tests/sdk/fixtures"
#endif

namespace {

const QStringList kDrafts{QStringLiteral("00000000-0000-4000-8000-00000000d001"),
                          QStringLiteral("00000000-0000-4000-8000-00000000d002"),
                          QStringLiteral("00000000-0000-4000-8000-00000000d003")};
const QString kSent = QStringLiteral("00000000-0000-4000-8000-00000000a006");

// Writes the fixture's SQL text into a new SQLite file; empty on success.
QString loadFixture(int version, const QString &path) {
    QFile f(QStringLiteral(IM_STORE_FIXTURES "/store-v%1.sql").arg(version));
    if (!f.open(QIODevice::ReadOnly))
        return QStringLiteral("cannot read %1").arg(f.fileName());
    const QString sql = QString::fromUtf8(f.readAll());
    QString error;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("fixture"));
        db.setDatabaseName(path);
        if (!db.open())
            error = db.lastError().text();
        QSqlQuery q(db);
        for (const QString &line : sql.split(u'\n', Qt::SkipEmptyParts)) {
            if (!error.isEmpty())
                break;
            if (line.startsWith(u"--"))
                continue;
            if (!q.exec(line))
                error = QStringLiteral("%1: %2").arg(q.lastError().text(), line);
        }
        q = QSqlQuery();
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("fixture"));
    return error;
}

QString convRow(const QString &db, const QString &conv) {
    return sqlScalar(db,
                     QStringLiteral("SELECT epoch || ',' || after || ',' || head || ',' || delivered || ',' || read"
                                    " || ',' || unread || ',' || min_seq || ',' || gap_to FROM conversations"
                                    " WHERE conv = ?"),
                     {conv})
        .toString();
}

} // namespace

class TestUpgrade : public QObject {
    Q_OBJECT
private slots:
    void an_older_store_keeps_its_drafts_gaps_and_cursors_data();
    void an_older_store_keeps_its_drafts_gaps_and_cursors();
};

void TestUpgrade::an_older_store_keeps_its_drafts_gaps_and_cursors_data() {
    QTest::addColumn<int>("version");
    for (int v = 1; v <= im::detail::Storage::SchemaVersion; ++v)
        QTest::addRow("schema %d", v) << v;
}

void TestUpgrade::an_older_store_keeps_its_drafts_gaps_and_cursors() {
    QFETCH(int, version);
    QTemporaryDir dir;
    const QString db = dir.filePath(QStringLiteral("old.db"));
    const QString loaded = loadFixture(version, db);
    QVERIFY2(loaded.isEmpty(), qPrintable(loaded));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT MAX(version) FROM schema_version")).toInt(), version);

    im::Client client;
    QVERIFY2(client.open(db), qPrintable(client.lastError()));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT MAX(version) FROM schema_version")).toInt(),
             im::detail::Storage::SchemaVersion);

    // The drafts: same cmids, bodies, creation order, attempts and last error.
    const QList<im::OutboxEntry> outbox = client.outbox();
    QStringList cmids, bodies;
    for (const im::OutboxEntry &e : outbox) {
        cmids << e.cmid();
        bodies << e.body();
    }
    QCOMPARE(cmids, kDrafts);
    QCOMPARE(bodies, (QStringList{QStringLiteral("draft one"), QStringLiteral("draft two, tried twice"),
                                  QStringLiteral("draft three")}));
    QCOMPARE(outbox.at(1).conv(), QStringLiteral("c2"));
    QCOMPARE(outbox.at(1).attempts(), 2);
    QCOMPARE(outbox.at(1).lastError(), QStringLiteral("UNAVAILABLE"));
    QCOMPARE(client.pendingCount(), 3);
    for (const QString &cmid : kDrafts)
        QCOMPARE(client.messageState(cmid), im::MessageState::Pending);
    QCOMPARE(client.messageState(kSent), im::MessageState::Sent);

    // Cursors and markers (epoch, after, head, delivered, read, unread,
    // min_seq, gap_to), events, gaps, identity.
    QCOMPARE(convRow(db, QStringLiteral("c1")), QStringLiteral("3,7,9,7,5,2,1,0"));
    QCOMPARE(convRow(db, QStringLiteral("c2")), QStringLiteral("1,120,120,120,110,10,101,50"));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c1'")).toInt(), 7);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = 'c2'")).toInt(), 20);
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT group_concat(lo || '-' || hi) FROM gaps WHERE conv = 'c2'")).toString(),
             version >= 2 ? QStringLiteral("51-100") : QString());
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT value FROM meta WHERE key = 'install_id'")).toString(),
             QStringLiteral("inst-fixture-v%1").arg(version));
    QCOMPARE(client.installId(), QStringLiteral("inst-fixture-v%1").arg(version));
    QCOMPARE(sqlScalar(db, QStringLiteral("SELECT value FROM meta WHERE key = 'user'")).toString(),
             QStringLiteral("ana"));

    // And they go out: the store's user's session resends each draft once,
    // with its own cmid, in creation order per conversation.
    FakeServer server;
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    server.convs[QStringLiteral("c2")].members = {QStringLiteral("ana"), QStringLiteral("cy")};
    // The server holds what the store saw (c1: 9 events of epoch 3, ours at
    // 6; c2: 120 events): else the stored cursors are ahead of it, and the
    // "restored server" path requeues message 6 (a fourth cmid).
    server.convs[QStringLiteral("c1")].epoch = 3;
    for (int seq = 1; seq <= 9; ++seq)
        server.append(QStringLiteral("c1"), seq == 6 ? QStringLiteral("ana") : QStringLiteral("ben"),
                      QStringLiteral("c1 message %1").arg(seq), seq == 6 ? kSent : QString());
    for (int seq = 1; seq <= 120; ++seq)
        server.append(QStringLiteral("c2"), QStringLiteral("cy"), QStringLiteral("c2 message %1").arg(seq));
    client.setServers({server.url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    client.setRetryBackoff(40, 300);
    client.connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(client.pendingCount(), 0, 20000);
    for (const QString &cmid : kDrafts)
        QCOMPARE(client.messageState(cmid), im::MessageState::Sent);
    QCOMPARE(server.distinctCmids(QStringLiteral("c1")), (QStringList{kDrafts.at(0), kDrafts.at(2)}));
    QCOMPARE(server.distinctCmids(QStringLiteral("c2")), QStringList{kDrafts.at(1)});
}

QTEST_GUILESS_MAIN(TestUpgrade)
#include "tst_upgrade.moc"
