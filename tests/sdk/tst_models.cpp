// The timeline model's own properties (issue 48, "Views that stay small,
// models that cannot re-enter"), against the in-process fake server
// (tst_client_fixture.h, conversation c1 of ana and ben):
//  - an open MessageListModel keeps its window while 2,000 messages arrive,
//    and each timeline read costs what the window costs, not what the
//    conversation or our own message history holds (measured in SQLite
//    virtual-machine steps of the model's query, read through
//    sqlite3_trace_v2 on the client's own connection);
//  - rows loaded by fetchMore() stay while messages arrive (nothing is
//    pulled from under a user reading history) until followNewest();
//  - a slot that sends from inside the model's row changes (a QML
//    delegate's handler) does not make rows show twice;
//  - im::ReversedProxyModel under a real QListView: newest at the bottom,
//    follows arrivals with appended rows, and never makes the view pull
//    history by itself.
#include "tst_client_fixture.h"

#include <im/client.h>
#include <im/messagelistmodel.h>
#include <im/reversedproxymodel.h>

#include <QtCore/QFileInfo>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlDriver>
#include <QtTest/QAbstractItemModelTester>
#include <QtCore/QStringListModel>
#include <QtWidgets/QHeaderView>
#include <QtWidgets/QTableView>
#include <QtTest/QtTest>
#include <QtWidgets/QApplication>
#include <QtWidgets/QListView>
#include <QtWidgets/QScrollBar>

#include <sqlite3.h>

#include <algorithm>
#include <cstring>

using im::MessageListModel;

namespace {

const QString kC1 = QStringLiteral("c1");

qint64 seqAt(const QAbstractItemModel &m, int row) {
    return m.index(row, 0).data(MessageListModel::SeqRole).toLongLong();
}

// The cost of each timeline read of one client: SQLite virtual-machine
// steps (rows visited, index probes, subqueries) of every run of
// Storage::messages()'s query, taken from the client's own SQLite
// connection when the statement finishes.
class ReadMeter {
public:
    explicit ReadMeter(const QString &dbPath) {
        const QString want = QFileInfo(dbPath).canonicalFilePath();
        for (const QString &name : QSqlDatabase::connectionNames()) {
            QSqlDatabase db = QSqlDatabase::database(name, false);
            if (!db.isOpen() || QFileInfo(db.databaseName()).canonicalFilePath() != want)
                continue;
            const QVariant h = db.driver()->handle();
            if (h.isValid() && std::strcmp(h.typeName(), "sqlite3*") == 0)
                db_ = *static_cast<sqlite3 *const *>(h.constData());
        }
        // The same SQLite as Qt's driver: it names the client's file.
        if (db_ && QFileInfo(QString::fromUtf8(sqlite3_db_filename(db_, "main"))).canonicalFilePath() != want)
            db_ = nullptr;
        if (db_)
            sqlite3_trace_v2(db_, SQLITE_TRACE_PROFILE, &ReadMeter::onProfile, this);
    }
    ~ReadMeter() {
        if (db_)
            sqlite3_trace_v2(db_, 0, nullptr, nullptr);
    }
    bool attached() const { return db_ != nullptr; }
    int reads() const { return int(steps_.size()); }
    qint64 last() const { return steps_.isEmpty() ? 0 : steps_.last(); }
    qint64 max() const { return steps_.isEmpty() ? 0 : *std::max_element(steps_.cbegin(), steps_.cend()); }
    void clear() { steps_.clear(); }

private:
    static int onProfile(unsigned, void *ctx, void *p, void *) {
        auto *stmt = static_cast<sqlite3_stmt *>(p);
        const char *sql = sqlite3_sql(stmt);
        // The timeline query (Storage::messages): the only one with this column.
        if (sql && std::strstr(sql, "AS recalled"))
            static_cast<ReadMeter *>(ctx)->steps_.append(sqlite3_stmt_status(stmt, SQLITE_STMTSTATUS_VM_STEP, 1));
        return 0;
    }
    sqlite3 *db_ = nullptr;
    QList<qint64> steps_;
};

// Every row's identity (a server event by seq, our draft by cmid, a gap by
// its range): a row shown twice repeats one.
QStringList rowKeys(const MessageListModel &m) {
    QStringList keys;
    for (int r = 0; r < m.count(); ++r) {
        const QString cmid = m.get(r, MessageListModel::CmidRole).toString();
        const qint64 seq = m.get(r, MessageListModel::SeqRole).toLongLong();
        keys << (seq > 0 ? QStringLiteral("seq %1").arg(seq)
                         : cmid.isEmpty() ? QStringLiteral("gap %1").arg(m.get(r, MessageListModel::GapFromRole).toLongLong())
                                          : QStringLiteral("cmid %1").arg(cmid));
    }
    return keys;
}

// Ben's `n` messages ("PREFIX 1".."PREFIX n") stored by the server, then
// ana connected, with all of them synced.
bool connectWithHistory(Fixture &f, int n, const QString &prefix = QStringLiteral("old")) {
    for (int i = 1; i <= n; ++i)
        f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("%1 %2").arg(prefix).arg(i));
    return f.openAndConnect() && QTest::qWaitFor([&f, n] { return f.cursor(kC1) == n; }, 10000);
}

bool unique(const QStringList &keys) { return QSet<QString>(keys.cbegin(), keys.cend()).size() == keys.size(); }

} // namespace

class TestModels : public QObject {
    Q_OBJECT
private slots:
    void an_open_timeline_keeps_its_window_through_2000_arrivals_and_each_read_stays_bounded();
    void rows_loaded_by_fetchmore_stay_while_messages_arrive_until_follownewest();
    void a_slot_that_sends_from_inside_the_row_changes_does_not_show_rows_twice();
    void a_reversed_proxy_in_a_qlistview_shows_the_newest_at_the_bottom_and_never_pulls_history();
    void a_reversed_proxy_whose_source_is_destroyed_resets_its_views();
};

void TestModels::an_open_timeline_keeps_its_window_through_2000_arrivals_and_each_read_stays_bounded() {
    constexpr int Window = 50, Arrivals = 2000, Own = 400;
    Fixture f;
    f.server.eventsCarryCmid = true;
    QVERIFY(connectWithHistory(f, Window, QStringLiteral("before")));
    MessageListModel model(&f.client, kC1);
    // The model tester calls fetchMore() after every change (as a view with
    // the model's last row in sight would): it checks every notification of
    // the model through a ReversedProxyModel, which never fetches (as a
    // view kept at the newest row).
    im::ReversedProxyModel proxy;
    proxy.setSourceModel(&model);
    QAbstractItemModelTester tester(&proxy, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QCOMPARE(model.windowRows(), Window);
    QTRY_COMPARE(model.count(), Window);
    ReadMeter meter(f.db);
    QVERIFY2(meter.attached(), "the client's SQLite connection was not found");
    // What one read of a full window costs.
    model.refresh();
    QCOMPARE(meter.reads(), 1);
    const qint64 base = meter.last();
    QVERIFY(base > 0);

    // 2,000 arrivals (pushed one by one) into the open model, in batches
    // that each let the model catch up.
    int most = 0;
    connect(&model, &MessageListModel::countChanged, this, [&] { most = std::max(most, model.count()); });
    meter.clear();
    for (int i = 1; i <= Arrivals; ++i) {
        f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("arrival %1").arg(i));
        if (i % 100 == 0)
            QTRY_COMPARE_WITH_TIMEOUT(seqAt(model, 0), qint64(Window + i), 20000);
    }
    QVERIFY(meter.reads() >= Arrivals / 100);
    qInfo("timeline reads during %d arrivals: %d, VM steps each: %lld at most, %lld for the first full window",
          Arrivals, meter.reads(), meter.max(), base);
    QVERIFY2(meter.max() <= 2 * base, qPrintable(QStringLiteral("a read cost %1 steps").arg(meter.max())));
    QVERIFY2(most <= Window, qPrintable(QStringLiteral("the window grew to %1 rows").arg(most)));
    QCOMPARE(model.count(), Window);
    QCOMPARE(seqAt(model, Window - 1), qint64(Arrivals + 1));
    QVERIFY(model.isFollowingNewest());

    // Our own messages: 400 sent and confirmed, then 50 of ben's that put
    // them all below the window. A read costs the window again, not our
    // message history.
    const int eventsBefore = Window + Arrivals;
    for (int i = 1; i <= Own; ++i)
        QVERIFY(!f.client.send(kC1, QStringLiteral("mine %1").arg(i)).isEmpty());
    QTRY_COMPARE_WITH_TIMEOUT(f.client.pendingCount(), 0, 60000);
    QTRY_COMPARE_WITH_TIMEOUT(f.cursor(kC1), qint64(eventsBefore + Own), 20000);
    for (int i = 1; i <= Window; ++i)
        f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("after %1").arg(i));
    QTRY_COMPARE_WITH_TIMEOUT(seqAt(model, 0), qint64(eventsBefore + Own + Window), 20000);
    QCOMPARE(model.count(), Window);
    QCOMPARE(sqlScalar(f.db, QStringLiteral("SELECT COUNT(*) FROM local_messages WHERE conv = 'c1'")).toInt(), Own);
    meter.clear();
    model.refresh();
    QCOMPARE(meter.reads(), 1);
    qInfo("a read with %d own messages below the window: %lld VM steps (first full window: %lld)", Own, meter.last(),
          base);
    QVERIFY2(meter.last() <= 2 * base, qPrintable(QStringLiteral("a read cost %1 steps").arg(meter.last())));
}

void TestModels::rows_loaded_by_fetchmore_stay_while_messages_arrive_until_follownewest() {
    Fixture f;
    QVERIFY(connectWithHistory(f, 120));
    MessageListModel model(&f.client, kC1);
    im::ReversedProxyModel proxy; // the model tester through it: see the test above
    proxy.setSourceModel(&model);
    QAbstractItemModelTester tester(&proxy, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QSignalSpy following(&model, &MessageListModel::followingNewestChanged);
    QTRY_COMPARE(model.count(), 50);
    QVERIFY(model.isFollowingNewest());
    // The user scrolls up: 50 older rows.
    QVERIFY(model.canFetchMore());
    model.fetchMore();
    QCOMPARE(model.count(), 100);
    QCOMPARE(seqAt(model, 99), 21);
    QVERIFY(!model.isFollowingNewest());
    QCOMPARE(following.size(), 1);
    // Messages arrive while he reads: added, and the row he reads stays.
    for (int i = 1; i <= 30; ++i)
        f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("new %1").arg(i));
    QTRY_COMPARE(seqAt(model, 0), 150);
    QCOMPARE(model.count(), 130);
    QCOMPARE(seqAt(model, 129), 21);
    // Back at the newest row: the window shrinks to its size and follows again.
    model.followNewest();
    QVERIFY(model.isFollowingNewest());
    QCOMPARE(following.size(), 2);
    QCOMPARE(model.count(), 50);
    QCOMPARE(seqAt(model, 0), 150);
    QCOMPARE(seqAt(model, 49), 101);
    f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("one more"));
    QTRY_COMPARE(seqAt(model, 0), 151);
    QCOMPARE(model.count(), 50);
    QCOMPARE(seqAt(model, 49), 102);
}

void TestModels::a_slot_that_sends_from_inside_the_row_changes_does_not_show_rows_twice() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    QVERIFY(connectWithHistory(f, 5));
    MessageListModel model(&f.client, kC1);
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QTRY_COMPARE(model.count(), 5);
    // A delegate's handler: answers ben's next message as soon as its row
    // is inserted, from inside the model's row changes.
    QString reply;
    QStringList keysAfterSlot;
    connect(&model, &QAbstractItemModel::rowsInserted, this, [&](const QModelIndex &, int first) {
        if (!reply.isEmpty() || model.get(first, MessageListModel::BodyRole).toString() != QStringLiteral("ping"))
            return;
        reply = f.client.send(kC1, QStringLiteral("pong"));
        QTimer::singleShot(0, this, [&] { keysAfterSlot = rowKeys(model); });
    });
    f.server.pushEvents = false; // ben's message comes by sync, while no draft is pending
    f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("ping"));
    f.client.sync(kC1);
    QTRY_VERIFY(!keysAfterSlot.isEmpty());
    QVERIFY(!reply.isEmpty());
    QVERIFY2(unique(keysAfterSlot), qPrintable(keysAfterSlot.join(QStringLiteral(", "))));
    QCOMPARE(keysAfterSlot.size(), 7); // 5 old, ping, our pong
    QCOMPARE(model.get(0, MessageListModel::CmidRole).toString(), reply);
    QCOMPARE(model.get(1, MessageListModel::BodyRole).toString(), QStringLiteral("ping"));
    // And once the reply is confirmed: the same rows a fresh model shows.
    f.server.pushEvents = true;
    QTRY_COMPARE(f.client.messageState(reply), MessageState::Sent);
    MessageListModel fresh(&f.client, kC1);
    QTRY_COMPARE(rowKeys(model), rowKeys(fresh));
    QCOMPARE(model.count(), 7);
}

void TestModels::a_reversed_proxy_in_a_qlistview_shows_the_newest_at_the_bottom_and_never_pulls_history() {
    Fixture f;
    f.server.eventsCarryCmid = true;
    QVERIFY(connectWithHistory(f, 300));
    MessageListModel model(&f.client, kC1);
    model.setWindowRows(20);
    im::ReversedProxyModel proxy;
    proxy.setSourceModel(&model);
    QAbstractItemModelTester tester(&proxy, QAbstractItemModelTester::FailureReportingMode::QtTest);
    QListView view;
    view.setModel(&proxy);
    view.resize(300, 200);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.scrollToBottom();
    QTRY_COMPARE(proxy.rowCount(), 20);
    QCOMPARE(seqAt(proxy, 0), 281);  // oldest at the top
    QCOMPARE(seqAt(proxy, 19), 300); // newest at the bottom
    QVERIFY(!proxy.canFetchMore({}));
    // The row at the bottom edge of the viewport is the newest message.
    const auto bottomRow = [&view] { return view.indexAt(QPoint(5, view.viewport()->height() - 3)).row(); };
    QTRY_COMPARE(bottomRow(), 19);
    // Arrivals: appended at the bottom, one row each (never a reset), the
    // view follows them, the window stays at 20 and no history is pulled.
    QSignalSpy inserted(&proxy, &QAbstractItemModel::rowsInserted);
    QSignalSpy reset(&proxy, &QAbstractItemModel::modelReset);
    connect(&proxy, &QAbstractItemModel::rowsInserted, &view, [&view] {
        QTimer::singleShot(0, &view, &QListView::scrollToBottom);
    });
    for (int i = 1; i <= 30; ++i) {
        f.server.append(kC1, QStringLiteral("ben"), QStringLiteral("new %1").arg(i));
        QTRY_COMPARE(seqAt(proxy, proxy.rowCount() - 1), qint64(300 + i));
        QCOMPARE(proxy.rowCount(), 20);
    }
    QCOMPARE(reset.size(), 0);
    for (const QList<QVariant> &args : inserted)
        QCOMPARE(args.at(1).toInt(), 19); // the new newest row
    QTRY_COMPARE(bottomRow(), 19);
    QCOMPARE(proxy.index(19, 0).data(MessageListModel::BodyRole).toString(), QStringLiteral("new 30"));
    QCOMPARE(seqAt(proxy, 0), 311);
    QCOMPARE(f.server.historyRequests, 0);
    // The app's scroll to the top loads older rows above: the model's
    // fetchMore() through the source.
    model.fetchMore();
    QCOMPARE(proxy.rowCount(), 40);
    QCOMPARE(seqAt(proxy, 0), 291);
    QCOMPARE(seqAt(proxy, 39), 330);
}

// The demo's window deletes its MessageListModel before its widgets: the
// proxy must tell its views the rows are gone. QSortFilterProxyModel alone
// drops them silently, and a QTableView scrolled down with a
// ResizeToContents column then spins for ever in sizeHintForColumn() when
// it is hidden (the demo's GUI test hung in cleanup).
void TestModels::a_reversed_proxy_whose_source_is_destroyed_resets_its_views() {
    QStringList rows;
    for (int i = 0; i < 200; ++i)
        rows << QStringLiteral("row %1").arg(i);
    auto *source = new QStringListModel(rows);
    im::ReversedProxyModel proxy;
    proxy.setSourceModel(source);
    QTableView view;
    view.setModel(&proxy);
    view.horizontalHeader()->setSectionResizeMode(0, QHeaderView::ResizeToContents);
    view.resize(300, 200);
    view.show();
    QVERIFY(QTest::qWaitForWindowExposed(&view));
    view.scrollToBottom();
    QTRY_VERIFY(view.verticalHeader()->visualIndexAt(0) > 0);
    QCOMPARE(proxy.index(199, 0).data().toString(), QStringLiteral("row 0"));
    QSignalSpy reset(&proxy, &QAbstractItemModel::modelReset);
    delete source;
    QCOMPARE(reset.size(), 1);
    QCOMPARE(proxy.rowCount(), 0);
    QCOMPARE(view.verticalHeader()->count(), 0);
    view.hide(); // without the reset: never returns
    QVERIFY(!view.isVisible());
}

QTEST_MAIN(TestModels)
#include "tst_models.moc"
