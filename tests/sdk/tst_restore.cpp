// Issue 48 against the real imserver and PostgreSQL: a restored server and
// the walk rule for pushes, seen from outside (the server's /metrics, a
// fresh client of another user).
//
// A restore is made as the harness allows: with the client away, the
// conversation's rows above a seq are deleted in the server's database
// (im_sdk_seed rewind: events and the request keys on them, next_seq,
// markers, periods), which is what a database restored from a backup taken
// at that seq holds for it; then imserver is restarted on it.
#include "client_p.h"
#include "sdktestutil.h"

#include <im/client.h>
#include <im/messagelistmodel.h>
#include <im/testing.h>

#include <QtCore/QTemporaryDir>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#ifdef IM_SERVER_BIN
#include "exerelative.h"
#include "realclient.h"
#include "servermetrics.h"
#endif

#include <memory>

using im::Client;
using im::ConnectionState;
using im::MessageState;

class TestRestore : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void a_restored_server_is_noticed_by_the_walk_and_the_lost_own_messages_are_resent_once();
    void hints_of_a_large_group_cost_no_convs_walk();
    void cleanupTestCase();

private:
#ifdef IM_SERVER_BIN
    std::unique_ptr<RealServer> server_;
#endif
    QTemporaryDir dir_;
    int stores_ = 0;
    QString storePath() { return dir_.filePath(QStringLiteral("store-%1.db").arg(++stores_)); }
    QString seed(const QStringList &args);
};

void TestRestore::initTestCase() {
#ifndef IM_SERVER_BIN
    QSKIP("imserver is not part of this build");
#else
    server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    const QString err = server_->start();
    QVERIFY2(err.isEmpty(), qPrintable(err));
#endif
}

void TestRestore::cleanupTestCase() {
#ifdef IM_SERVER_BIN
    if (server_)
        server_->stop();
#endif
}

QString TestRestore::seed(const QStringList &args) {
#ifdef IM_SERVER_BIN
    return server_->seed(exeRelativePath(IM_SEED_BIN), args);
#else
    Q_UNUSED(args);
    return QStringLiteral("no server");
#endif
}

namespace {

int rowsWithBody(im::MessageListModel &model, const QString &body) {
    int n = 0;
    for (int row = 0; row < model.count(); ++row)
        n += model.get(row, im::MessageListModel::BodyRole).toString() == body ? 1 : 0;
    return n;
}

} // namespace

// ana sends three messages to ana-ben, ben one more; the server is then
// restored to just after ana's first while ana is away (nothing is pushed
// to her). Her next session's `convs` walk sees the head below her cursor
// and rebuilds; her two lost messages are sent again with their cmids,
// once (the server's /metrics counts exactly two sends), and her timeline
// shows each of her messages once and ben's lost one not at all. A fresh
// client of ben's sees each of ana's messages once, with her cmids.
void TestRestore::a_restored_server_is_noticed_by_the_walk_and_the_lost_own_messages_are_resent_once() {
#ifdef IM_SERVER_BIN
    const QString conv = QStringLiteral("ana-ben");
    const QString anaStore = storePath();
    auto ana = makeRealClient(*server_, QStringLiteral("ana"), anaStore);
    QVERIFY(ana->isOpen());
    ana->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
    im::MessageListModel timeline(ana.get(), conv);
    const QStringList bodies{QStringLiteral("one, kept"), QStringLiteral("two, lost"), QStringLiteral("three, lost")};
    QStringList cmids;
    for (const QString &b : bodies) {
        cmids << ana->send(conv, b);
        QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmids.last()), MessageState::Sent, 30000);
    }
    const qint64 kept =
        sqlScalar(anaStore, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmids.at(0)}).toLongLong();
    QVERIFY(kept > 0);
    {
        auto ben = makeRealClient(*server_, QStringLiteral("ben"), storePath());
        ben->connectToServer();
        const QString c = ben->send(conv, QStringLiteral("ben's, lost"));
        QTRY_COMPARE_WITH_TIMEOUT(ben->messageState(c), MessageState::Sent, 30000);
    }
    QTRY_COMPARE_WITH_TIMEOUT(rowsWithBody(timeline, QStringLiteral("ben's, lost")), 1, 30000);
    QTRY_COMPARE_WITH_TIMEOUT(
        sqlScalar(anaStore, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong(),
        kept + 3, 30000);

    im::testing::Faults(ana.get()).setOffline(true);
    QTRY_COMPARE(ana->connectionState(), ConnectionState::Disconnected);
    const QString err = seed({QStringLiteral("rewind"), conv, QString::number(kept)});
    QVERIFY2(err.isEmpty(), qPrintable(err));
    // The operator restarts the server on the restored database (nothing it
    // held in memory, such as how far it has pushed, survives that).
    const QString down = server_->restart();
    QVERIFY2(down.isEmpty(), qPrintable(down));
    ana->setServers({server_->url});
    const qint64 sendsBefore = serverRequests(server_->url, QStringLiteral("send"));
    QVERIFY(sendsBefore >= 0);
    im::testing::Faults(ana.get()).setOffline(false);

    // Rebuilt and resent: her lost messages are back at the server's next seqs.
    QTRY_COMPARE_WITH_TIMEOUT(
        sqlScalar(anaStore, QStringLiteral("SELECT seq FROM local_messages WHERE cmid = ?"), {cmids.at(2)}).toLongLong(),
        kept + 2, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmids.at(1)), MessageState::Sent, 30000);
    QTRY_COMPARE_WITH_TIMEOUT(
        sqlScalar(anaStore, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong(),
        kept + 2, 30000);
    for (const QString &b : bodies)
        QTRY_COMPARE_WITH_TIMEOUT(rowsWithBody(timeline, b), 1, 30000);
    QCOMPARE(rowsWithBody(timeline, QStringLiteral("ben's, lost")), 0);

    // Once: another session of hers sends nothing again.
    im::testing::Faults(ana.get()).setOffline(true);
    QTRY_COMPARE(ana->connectionState(), ConnectionState::Disconnected);
    const qint64 walks = serverRequests(server_->url, QStringLiteral("convs"));
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    im::testing::Faults(ana.get()).setOffline(false);
    QTRY_VERIFY_WITH_TIMEOUT(serverRequests(server_->url, QStringLiteral("convs")) > walks, 60000);
    ana->sync(conv); // answered after the walk's page on this connection
    QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{conv}), 60000);
    QCOMPARE(serverRequests(server_->url, QStringLiteral("send")), sendsBefore + 2);
    for (const QString &b : bodies)
        QCOMPARE(rowsWithBody(timeline, b), 1);

    // Outside: ben, on a fresh store, sees each of hers once, with her cmid.
    const QString benStore = storePath();
    auto ben = makeRealClient(*server_, QStringLiteral("ben"), benStore);
    ben->connectToServer();
    QTRY_COMPARE_WITH_TIMEOUT(
        sqlScalar(benStore, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong(),
        kept + 2, 60000);
    for (int i = 0; i < 3; ++i) {
        QCOMPARE(sqlScalar(benStore, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ? AND body = ?"),
                           {conv, bodies.at(i)})
                     .toInt(),
                 1);
        QCOMPARE(sqlScalar(benStore, QStringLiteral("SELECT cmid FROM events WHERE conv = ? AND body = ?"),
                           {conv, bodies.at(i)})
                     .toString(),
                 cmids.at(i));
    }
    QCOMPARE(sqlScalar(benStore, QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ? AND body = ?"),
                       {conv, QStringLiteral("ben's, lost")})
                 .toInt(),
             0);
#endif
}

// A 60-member group (above push_full_max: hints only). 30 messages from
// ben: each is a hint to ana; the server's /metrics counts no `convs`
// request from the first hint to the last sync (before: one walk per hint
// or burst of hints), and ana's badge ends at the server's count (a walk
// after the run changes nothing).
void TestRestore::hints_of_a_large_group_cost_no_convs_walk() {
#ifdef IM_SERVER_BIN
    const QString conv = QStringLiteral("big-hints");
    const QString err = seed({QStringLiteral("group"), conv, QStringLiteral("bh"), QStringLiteral("58"),
                              QStringLiteral("ana"), QStringLiteral("ben")});
    QVERIFY2(err.isEmpty(), qPrintable(err));
    const QString anaStore = storePath();
    auto ana = makeRealClient(*server_, QStringLiteral("ana"), anaStore);
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    ana->connectToServer();
    // The session's own walk is over: the sync of every conversation it
    // listed (a new store: all of ana's) answered; then /metrics is read.
    for (const char *c : {"ana-ben", "team", "big-hints"})
        QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{QString::fromLatin1(c)}), 60000);
    const auto head = [&] {
        return sqlScalar(anaStore, QStringLiteral("SELECT after FROM conversations WHERE conv = ?"), {conv}).toLongLong();
    };
    const qint64 start = head();
    // ben's session walks too: over before /metrics is read.
    auto ben = makeRealClient(*server_, QStringLiteral("ben"), storePath());
    QSignalSpy benSynced(ben.get(), &Client::conversationSynced);
    ben->connectToServer();
    for (const char *c : {"ana-ben", "team", "big-hints"})
        QTRY_VERIFY_WITH_TIMEOUT(benSynced.contains(QVariantList{QString::fromLatin1(c)}), 60000);
    const qint64 convsBefore = serverRequests(server_->url, QStringLiteral("convs"));
    QVERIFY(convsBefore >= 1);
    constexpr int n = 30;
    for (int i = 0; i < n; ++i)
        ben->send(conv, QStringLiteral("hint %1").arg(i));
    QTRY_COMPARE_WITH_TIMEOUT(head(), start + n, 60000);
    // Nothing left to do, and no walk scheduled (a scheduled one would run
    // and be counted before this wait ends).
    const im::Sync &sync = im::ClientPrivate::get(ana.get())->sync;
    QTRY_VERIFY_WITH_TIMEOUT(!sync.convsRefreshPending() && !sync.isWalkingConvs() && sync.activeSyncs() == 0, 30000);
    QCOMPARE(serverRequests(server_->url, QStringLiteral("convs")), convsBefore);
    const qint64 badge =
        sqlScalar(anaStore, QStringLiteral("SELECT unread FROM conversations WHERE conv = ?"), {conv}).toLongLong();
    QCOMPARE(badge, qint64(n));
    // The server's count: a new session's walk stores it.
    im::testing::Faults(ana.get()).setOffline(true);
    QTRY_COMPARE(ana->connectionState(), ConnectionState::Disconnected);
    im::testing::Faults(ana.get()).setOffline(false);
    QTRY_VERIFY_WITH_TIMEOUT(serverRequests(server_->url, QStringLiteral("convs")) > convsBefore, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(ana->connectionState(), ConnectionState::Connected, 60000);
    QCOMPARE(sqlScalar(anaStore, QStringLiteral("SELECT unread FROM conversations WHERE conv = ?"), {conv}).toLongLong(),
             badge);
#endif
}

QTEST_GUILESS_MAIN(TestRestore)
#include "tst_restore.moc"
