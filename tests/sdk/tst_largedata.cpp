// The SDK on real-world sizes, against the real imserver (embedded
// PostgreSQL): a user in 1,000 conversations, maximum-size bodies through a
// 64 KiB receive limit, long histories. Demo data: users ana, ben, cy;
// direct conv "ana-ben"; group "team".
#include "exerelative.h"
#include "realserver.h"

#include "client_p.h"

#include <im/client.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>

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
using im::ConversationListModel;
using im::MessageListModel;
using im::MessageState;

namespace {
qint64 seqAt(const MessageListModel &m, int row) { return m.get(row, MessageListModel::SeqRole).toLongLong(); }
QString kindAt(const MessageListModel &m, int row) { return m.get(row, MessageListModel::KindRole).toString(); }
// Seqs of the event rows, which must be strictly descending: newest first
// (obligation 15), each event once.
bool descendingOnce(const MessageListModel &m) {
    qint64 last = 0;
    for (int i = m.count() - 1; i >= 0; --i) {
        if (kindAt(m, i) == u"gap")
            continue;
        if (seqAt(m, i) <= last)
            return false;
        last = seqAt(m, i);
    }
    return true;
}
// The row that is the i-th from the oldest end (the model is newest first).
int fromOldest(const MessageListModel &m, int i) { return m.count() - 1 - i; }
} // namespace

class TestLargeData : public QObject {
    Q_OBJECT
private slots:
    void initTestCase();
    void cleanupTestCase();
    void a_user_in_1000_conversations_lists_them_all_and_resyncs_only_what_moved();
    void two_hundred_maximum_bodies_sync_completely_through_a_64k_receive_limit();
    void a_fresh_install_opens_a_long_conversation_with_its_newest_window_and_loads_older_on_demand();
    void a_client_back_after_a_long_absence_keeps_a_gap_and_fills_it_on_demand();
    void a_conversation_with_new_activity_moves_up_by_a_row_move_not_a_reset();

private:
    std::unique_ptr<Client> makeClient(const QString &user, const QString &db);
    QString seed(const QStringList &args);

    QTemporaryDir dir_;
    std::unique_ptr<RealServer> server_;
};

void TestLargeData::initTestCase() {
    QVERIFY(dir_.isValid());
    server_ = std::make_unique<RealServer>(exeRelativePath(IM_SERVER_BIN));
    const QString error = server_->start();
    QVERIFY2(error.isEmpty(), qPrintable(error));
}

void TestLargeData::cleanupTestCase() { server_.reset(); }

QString TestLargeData::seed(const QStringList &args) { return server_->seed(exeRelativePath(IM_SEED_BIN), args); }

std::unique_ptr<Client> TestLargeData::makeClient(const QString &user, const QString &db) {
    auto c = std::make_unique<Client>();
    c->setServers({server_->url});
    c->setCredentials(server_->tokens.value(user));
    c->setRequestTimeout(30000);
    c->setReconnectBackoff(100, 1000);
    c->setRetryBackoff(100, 800);
    if (!c->open(dir_.filePath(db)))
        qWarning("open: %s", qPrintable(c->lastError()));
    // Diagnostics for a failing run.
    connect(c.get(), &Client::errorOccurred, this, [user](const QString &code, const QString &msg) {
        qWarning("%s: error %s: %s", qPrintable(user), qPrintable(code), qPrintable(msg.left(300)));
    });
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
    QTRY_VERIFY_WITH_TIMEOUT(!d->sync.isWalkingConvs(), 120000);
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
    const qint64 teamAt = d->storage.cursors()->value(QStringLiteral("team")).after;
    QVERIFY(teamAt > 0);
    cy->disconnectFromServer();
    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-many.db"));
    ana->connectToServer();
    const QString cmid = ana->send(QStringLiteral("team"), QStringLiteral("while cy was away"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 60000);
    synced.clear();
    const quint64 before = d->sync.syncRequests();
    cy->connectToServer();
    // The new event comes by a sync (team's head moved) or, when the
    // gateway's fan-out of it reaches cy's fresh subscription, by a push.
    QTRY_VERIFY_WITH_TIMEOUT(cy->connectionState() == ConnectionState::Connected
                                 && d->storage.cursors()->value(QStringLiteral("team")).after == teamAt + 1,
                             60000);
    QTRY_VERIFY_WITH_TIMEOUT(!d->sync.isWalkingConvs(), 120000);
    QVERIFY2(d->sync.syncRequests() - before <= 1,
             qPrintable(QStringLiteral("%1 syncs after the reconnect").arg(d->sync.syncRequests() - before)));
    for (const QList<QVariant> &s : std::as_const(synced))
        QCOMPARE(s.at(0).toString(), QStringLiteral("team"));
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

// Obligation 13: a fresh install downloads the newest window of a long
// conversation, not its history; the model shows windowRows rows and loads
// older ones on fetchMore (local first, then `history` from the server),
// inserting rows at the top (never a reset).
void TestLargeData::a_fresh_install_opens_a_long_conversation_with_its_newest_window_and_loads_older_on_demand() {
    QString err = seed({QStringLiteral("convs"), QStringLiteral("ana"), QStringLiteral("long"), QStringLiteral("2")});
    QVERIFY2(err.isEmpty(), qPrintable(err));
    const QString conv = QStringLiteral("long-100000"); // join at 1, then 5,000 events: head 5001
    err = seed({QStringLiteral("events"), conv, QStringLiteral("ben"), QStringLiteral("5000")});
    QVERIFY2(err.isEmpty(), qPrintable(err));

    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-long.db"));
    ana->setHistoryWindow(100);
    ClientPrivate *d = ClientPrivate::get(ana.get());
    MessageListModel model(ana.get(), conv);
    model.setWindowRows(50);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    QSignalSpy inserted(&model, &QAbstractItemModel::rowsInserted);
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{conv}), 120000);
    // Stored: the newest window only, the cursor at the head, a gap below.
    const auto events = d->storage.events(conv);
    QVERIFY(events);
    QCOMPARE(events->size(), 100);
    QCOMPARE(events->first().seq, 4902);
    QCOMPARE(events->last().seq, 5001);
    QCOMPARE(d->storage.cursors()->value(conv).after, 5001);
    QCOMPARE(*d->storage.gaps(conv), (QList<im::detail::Gap>{{1, 4901}}));

    // Shown: the newest 50.
    QTRY_COMPARE(model.count(), 50);
    QCOMPARE(seqAt(model, 49), 4952);
    QCOMPARE(seqAt(model, 0), 5001);
    QVERIFY(model.canFetchMore());
    model.fetchMore(); // from the local database
    QCOMPARE(model.count(), 100);
    QCOMPARE(seqAt(model, 99), 4902);
    QVERIFY(model.canFetchMore()); // the server has older ones
    inserted.clear();
    model.fetchMore(); // a `history` window from the server
    QVERIFY(model.isLoadingOlder());
    QVERIFY(!model.canFetchMore());
    QTRY_COMPARE_WITH_TIMEOUT(model.count(), 150, 60000);
    QVERIFY(!model.isLoadingOlder());
    QCOMPARE(seqAt(model, 149), 4852);
    QVERIFY(!inserted.isEmpty());
    QCOMPARE(inserted.first().at(1).toInt(), 100); // appended at the oldest end
    QCOMPARE(*d->storage.gaps(conv), (QList<im::detail::Gap>{{1, 4801}}));
    QVERIFY(descendingOnce(model));

    // A new event: appended as one inserted row.
    inserted.clear();
    const QString cmid = ana->send(conv, QStringLiteral("newest"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 60000);
    QTRY_COMPARE(seqAt(model, 0), 5002);
    QCOMPARE(model.count(), 151);
    QVERIFY(descendingOnce(model));
    QCOMPARE(resets.size(), 0);
}

// Obligation 13: back after a long absence (more than the backlog limit
// behind), the client takes the newest window and keeps a gap marker, shown
// between the old and new events and filled on demand.
void TestLargeData::a_client_back_after_a_long_absence_keeps_a_gap_and_fills_it_on_demand() {
    const QString conv = QStringLiteral("long-100001"); // made by the test above: join at 1
    QString err = seed({QStringLiteral("events"), conv, QStringLiteral("ben"), QStringLiteral("10")}); // 2..11
    QVERIFY2(err.isEmpty(), qPrintable(err));
    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-away.db"));
    ana->setHistoryWindow(100);
    ana->setBacklogLimit(1000);
    ClientPrivate *d = ClientPrivate::get(ana.get());
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{conv}), 120000);
    QCOMPARE(d->storage.events(conv)->size(), 11);
    ana->disconnectFromServer();

    err = seed({QStringLiteral("events"), conv, QStringLiteral("ben"), QStringLiteral("3000")}); // 12..3011
    QVERIFY2(err.isEmpty(), qPrintable(err));
    synced.clear();
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(synced.contains(QVariantList{conv}), 120000);
    QCOMPARE(d->storage.events(conv)->size(), 11 + 100); // not the 3,000 missed
    QCOMPARE(d->storage.cursors()->value(conv).after, 3011);
    QCOMPARE(*d->storage.gaps(conv), (QList<im::detail::Gap>{{12, 2911}}));

    MessageListModel model(ana.get(), conv);
    model.setWindowRows(60);
    QSignalSpy resets(&model, &QAbstractItemModel::modelReset);
    QTRY_COMPARE(model.count(), 60);
    while (model.canFetchMore() && model.count() < 200)
        model.fetchMore(); // all local: the window, then the 11 old events
    // 11 old events, the gap marker, 100 new events.
    QCOMPARE(model.count(), 112);
    QCOMPARE(seqAt(model, fromOldest(model, 10)), 11);
    QCOMPARE(kindAt(model, fromOldest(model, 11)), QStringLiteral("gap"));
    QCOMPARE(model.get(fromOldest(model, 11), MessageListModel::GapFromRole).toLongLong(), 12);
    QCOMPARE(model.get(fromOldest(model, 11), MessageListModel::GapToRole).toLongLong(), 2911);
    QCOMPARE(seqAt(model, fromOldest(model, 12)), 2912);
    QVERIFY(!model.canFetchMore());

    QVERIFY(model.fillGap(fromOldest(model, 11))); // its newest 100 events
    QTRY_COMPARE_WITH_TIMEOUT(model.count(), 212, 60000);
    QCOMPARE(kindAt(model, fromOldest(model, 11)), QStringLiteral("gap"));
    QCOMPARE(model.get(fromOldest(model, 11), MessageListModel::GapToRole).toLongLong(), 2811);
    QCOMPARE(seqAt(model, fromOldest(model, 12)), 2812);
    QCOMPARE(*d->storage.gaps(conv), (QList<im::detail::Gap>{{12, 2811}}));
    QVERIFY(descendingOnce(model));
    QCOMPARE(resets.size(), 0);
}

// Issue 11: the conversation list reorders by row moves.
void TestLargeData::a_conversation_with_new_activity_moves_up_by_a_row_move_not_a_reset() {
    auto ana = makeClient(QStringLiteral("ana"), QStringLiteral("ana-list.db"));
    ConversationListModel list(ana.get());
    QSignalSpy synced(ana.get(), &Client::conversationSynced);
    ana->connectToServer();
    QTRY_VERIFY_WITH_TIMEOUT(list.count() >= 3 && synced.size() >= 3, 120000);
    QTRY_VERIFY_WITH_TIMEOUT(!ClientPrivate::get(ana.get())->sync.isWalkingConvs(), 120000);
    const int last = list.count() - 1;
    QTRY_VERIFY(last > 0 && list.get(last, ConversationListModel::LastTimestampRole).toDateTime().isValid());
    const QString conv = list.get(last, ConversationListModel::ConvRole).toString();
    QSignalSpy resets(&list, &QAbstractItemModel::modelReset);
    QSignalSpy moved(&list, &QAbstractItemModel::rowsMoved);
    const QString cmid = ana->send(conv, QStringLiteral("bump"));
    QTRY_COMPARE_WITH_TIMEOUT(ana->messageState(cmid), MessageState::Sent, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(list.indexOf(conv), 0, 30000);
    QVERIFY(!moved.isEmpty());
    QCOMPARE(resets.size(), 0);
}

QTEST_GUILESS_MAIN(TestLargeData)
#include "tst_largedata.moc"
