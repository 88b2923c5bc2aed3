// The SDK on real-world sizes, against the real imserver (embedded
// PostgreSQL): a user in 1,000 conversations, maximum-size bodies through a
// 64 KiB receive limit, long histories. Demo data: users ana, ben, cy;
// direct conv "ana-ben"; group "team".
#include "realserver.h"

#include "client_p.h"

#include <im/client.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <memory>

#ifndef IM_SERVER_BIN
#error "IM_SERVER_BIN must name the imserver executable"
#endif

using im::Client;
using im::ClientPrivate;
using im::ConnectionState;
using im::MessageState;

class TestLargeData : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase();
    void a_user_in_1000_conversations_lists_them_all_and_resyncs_only_what_moved();
    void two_hundred_maximum_bodies_sync_completely_through_a_64k_receive_limit();

private:
    std::unique_ptr<Client> makeClient(const QString &user, const QString &db);
    QString seed(const QStringList &args);

    QTemporaryDir dir_;
    std::unique_ptr<RealServer> server_;
};

void TestLargeData::initTestCase() {
    QVERIFY(dir_.isValid());
    server_ = std::make_unique<RealServer>(QStringLiteral(IM_SERVER_BIN));
    const QString error = server_->start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
}

void TestLargeData::cleanupTestCase() { server_.reset(); }

QString TestLargeData::seed(const QStringList &args) {
    QProcess p;
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start(QStringLiteral(IM_SEED_BIN), QStringList{server_->dbUrl()} + args);
    if (!p.waitForFinished(300000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0)
        return QStringLiteral("seed failed: ") + QString::fromUtf8(p.readAll());
    return {};
}

std::unique_ptr<Client> TestLargeData::makeClient(const QString &user, const QString &db) {
    auto c = std::make_unique<Client>();
    c->setServers({server_->url});
    c->setCredentials(server_->tokens.value(user));
    c->setRequestTimeout(30000);
    c->setReconnectBackoff(100, 1000);
    c->setRetryBackoff(100, 800);
    if (!c->open(dir_.filePath(db)))
        qWarning("open: %s", qPrintable(c->lastError()));
    return c;
}

// Issue 9's test through the SDK: convs pages all arrive, every frame within
// MAX_FRAME; a reconnect syncs only the conversation that moved, and never
// more than the concurrency bound at once.
void TestLargeData::a_user_in_1000_conversations_lists_them_all_and_resyncs_only_what_moved() {
    const QString err = seed({QStringLiteral("convs"), QStringLiteral("cy"), QStringLiteral("bulk"),
                              QStringLiteral("1000")});
    QVERIFY2(err.isEmpty(), qPrintable(err));
    auto cy = makeClient(QStringLiteral("cy"), QStringLiteral("cy-many.db"));
    ClientPrivate *d = ClientPrivate::get(cy.get());
    d->conn.transport()->setMaxIncomingBytes(64 * 1024);
    qsizetype largest = 0;
    connect(d->conn.transport(), &im::detail::Transport::textReceived, this,
            [&largest](const QByteArray &f) { largest = std::max(largest, f.size()); });
    QSignalSpy connected(cy.get(), &Client::connectionStateChanged);
    QSignalSpy synced(cy.get(), &Client::conversationSynced);
    cy->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(cy->conversationIds().size(), 1001, 240000); // bulk-* and team
    QTRY_COMPARE_WITH_TIMEOUT(synced.size(), 1001, 240000);
    QTRY_VERIFY(!d->sync.isWalkingConvs());
    QVERIFY2(largest <= 64 * 1024, qPrintable(QString::number(largest)));
    QVERIFY(largest > 0);
    QCOMPARE(d->sync.syncRequests(), quint64(1001));
    QVERIFY2(d->sync.peakActiveSyncs() <= d->sync.maxConcurrent,
             qPrintable(QStringLiteral("%1 syncs at once").arg(d->sync.peakActiveSyncs())));
    int sessions = 0;
    for (const QList<QVariant> &a : connected)
        sessions += a.at(0).value<ConnectionState>() == ConnectionState::Connected;
    QCOMPARE(sessions, 1);

    // Away for a while: one conversation moves. The next session syncs that
    // one only (the other 1,000 heads equal their cursors).
    cy->disconnectFromServer();
    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-many.db"));
    ana->connectToServer();
    const QString cmid = ana->send(QStringLiteral("team"), QStringLiteral("while cy was away"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 60000);
    synced.clear();
    const quint64 before = d->sync.syncRequests();
    cy->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(synced.size(), 1, 60000);
    QCOMPARE(synced.at(0).at(0).toString(), QStringLiteral("team"));
    QTRY_VERIFY(cy->connectionState() == ConnectionState::Connected && !d->sync.isWalkingConvs());
    QCOMPARE(d->sync.syncRequests() - before, quint64(1));
    QCOMPARE(synced.size(), 1);
}

namespace {
// 4,000 code points of CJK, 4-byte emoji, control characters (escaped as
// \u00XX in JSON: six bytes each) and ASCII: about 14 KB of JSON.
QString maximumBody(int i) {
    QString s;
    const QString cjk = QStringLiteral("汉字漢字かな한글");
    const QString emoji = QString::fromUcs4(U"😀🚀🎉🧪");
    for (int k = 0; s.size() < 12000 && k < 4000; ++k) {
        switch (k % 4) {
        case 0: s += cjk.at((k + i) % cjk.size()); break;
        case 1: s += emoji.mid(((k + i) % 4) * 2, 2); break;
        case 2: s += QChar(char16_t(1 + (k + i) % 31)); break; // a control character
        default: s += QChar(char16_t('a' + (k + i) % 26)); break;
        }
    }
    return s;
}
} // namespace

// Issue 9's test through the SDK: 200 maximum bodies, synced by an SDK that
// keeps a 64 KiB receive limit: every event once, in order, one session.
void TestLargeData::two_hundred_maximum_bodies_sync_completely_through_a_64k_receive_limit() {
    auto ben = makeClient(QStringLiteral("ben"), QStringLiteral("ben-big.db"));
    ben->connectToServer();
    QStringList bodies;
    for (int i = 0; i < 200; ++i) {
        bodies.append(maximumBody(i));
        QCOMPARE(bodies.last().toUcs4().size(), 4000);
        QVERIFY2(!ben->send(QStringLiteral("ana-ben"), bodies.last()).isEmpty(), qPrintable(ben->lastError()));
    }
    QTRY_COMPARE_WITH_TIMEOUT(ben->pendingCount(), 0, 240000);

    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-big.db"));
    ClientPrivate *d = ClientPrivate::get(ana.get());
    d->conn.transport()->setMaxIncomingBytes(64 * 1024);
    ana->setSyncPageSize(200);
    qsizetype largest = 0;
    connect(d->conn.transport(), &im::detail::Transport::textReceived, this,
            [&largest](const QByteArray &f) { largest = std::max(largest, f.size()); });
    QSignalSpy connected(ana.get(), &Client::connectionStateChanged);
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{QStringLiteral("ana-ben")}), 240000);
    const std::optional<QList<im::proto::Event>> events = d->storage.events(QStringLiteral("ana-ben"));
    QVERIFY(events);
    QStringList got;
    qint64 last = 0;
    for (const im::proto::Event &e : *events) {
        QVERIFY2(e.seq > last, "events out of order or twice");
        last = e.seq;
        if (e.kind == u"msg" && e.sender == u"ben" && e.body.size() > 1000)
            got.append(e.body);
    }
    QCOMPARE(got.size(), 200);
    QCOMPARE(got, bodies);
    QVERIFY2(largest <= 64 * 1024, qPrintable(QString::number(largest)));
    QVERIFY(largest > 32 * 1024); // pages were filled up to the size rule, not cut by count
    int sessions = 0;
    for (const QList<QVariant> &a : connected)
        sessions += a.at(0).value<ConnectionState>() == ConnectionState::Connected;
    QCOMPARE(sessions, 1); // no reconnect loop
}

QTEST_GUILESS_MAIN(TestLargeData)
#include "tst_largedata.moc"
