// The public API as an app uses it, linked against the shared library (which
// exports only the API), against the in-process fake server. Issue 26 item 9:
// the models keep working when the app calls client->disconnect() (they are
// wired to the client privately, not through its public signals), and go
// empty when the client is destroyed. Issue 48: OutboxEntry is a value with
// a private part, every setting has a getter and a property, and a client
// moved to a worker thread takes all of its parts along.
#include "fakeserver.h"

#include <im/client.h>
#include <im/search.h>
#include <im/conversationlistmodel.h>
#include <im/messagelistmodel.h>
#include <im/outboxmodel.h>

#include <QtCore/QMetaProperty>
#include <QtCore/QMutex>
#include <QtCore/QTemporaryDir>
#include <QtCore/QThread>
#include <QtCore/QTimer>
#include <QtTest/QSignalSpy>
#include <QtTest/QtTest>

#include <memory>

using im::Client;
using im::ConnectionState;
using im::MessageState;

class TestApi : public QObject {
    Q_OBJECT
private slots:
    void models_keep_working_after_the_app_disconnects_every_client_signal();
    void models_let_go_of_a_destroyed_client();
    void outbox_entry_is_a_value_with_a_private_part();
    void search_result_is_a_value_with_a_private_part();
    void every_setting_has_a_getter_and_a_property();
    void a_client_lives_on_a_worker_thread();
    void sync_logs_windows_gaps_and_resets();
};

namespace {

int rowOfCmid(const im::MessageListModel &m, const QString &cmid) {
    for (int r = 0; r < m.count(); ++r)
        if (m.get(r, im::MessageListModel::CmidRole).toString() == cmid)
            return r;
    return -1;
}

} // namespace

void TestApi::models_keep_working_after_the_app_disconnects_every_client_signal() {
    QTemporaryDir dir;
    FakeServer server;
    server.listen();
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("from ben"));
    Client client;
    client.setServers({server.url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    client.setReconnectBackoff(40, 200);
    im::ConversationListModel convs(&client);
    im::MessageListModel messages(&client, QStringLiteral("c1"));
    im::OutboxModel outbox(&client);
    QVERIFY(client.open(dir.filePath(QStringLiteral("a.db"))));

    // What an app may do: drop every connection of the Client's signals
    // (QObject::disconnect() with no arguments), e.g. when a view goes away.
    client.disconnect();

    // Offline: the draft shows in the outbox and the timeline at once.
    const QString cmid = client.send(QStringLiteral("c1"), QStringLiteral("mine"));
    QVERIFY(!cmid.isEmpty());
    QCOMPARE(outbox.depth(), 1);
    QCOMPARE(outbox.get(0, im::OutboxModel::CmidRole).toString(), cmid);
    QTRY_COMPARE(messages.count(), 1);
    QCOMPARE(messages.get(0, im::MessageListModel::StateRole).toInt(), int(MessageState::Pending));

    // Online: the conversation list fills from `convs`, ben's message and
    // ours (now Sent, with its seq) show, the outbox empties.
    client.connectToServer();
    QTRY_COMPARE(client.connectionState(), ConnectionState::Connected);
    QTRY_COMPARE(convs.count(), 1);
    QCOMPARE(convs.get(0, im::ConversationListModel::ConvRole).toString(), QStringLiteral("c1"));
    QTRY_COMPARE(messages.count(), 2);
    QTRY_COMPARE(messages.get(rowOfCmid(messages, cmid), im::MessageListModel::StateRole).toInt(),
                 int(MessageState::Sent));
    QCOMPARE(messages.get(rowOfCmid(messages, cmid), im::MessageListModel::SeqRole).toLongLong(), 2);
    QTRY_COMPARE(outbox.depth(), 0);
    QTRY_COMPARE(convs.get(0, im::ConversationListModel::HeadRole).toLongLong(), 2);

    // The typed report still follows every error for a receiver connected
    // after the disconnect().
    QSignalSpy typed(&client, &Client::errorReported);
    QVERIFY(client.send(QStringLiteral("c1"), QString()).isEmpty()); // refused: empty body
    QCOMPARE(typed.size(), 1);
    QCOMPARE(typed.at(0).at(0).value<im::Error>(), im::Error::InvalidArgument);
}

void TestApi::models_let_go_of_a_destroyed_client() {
    QTemporaryDir dir;
    auto client = std::make_unique<Client>();
    QVERIFY(client->open(dir.filePath(QStringLiteral("a.db"))));
    client->send(QStringLiteral("c1"), QStringLiteral("queued"));
    im::MessageListModel messages(client.get(), QStringLiteral("c1"));
    im::OutboxModel outbox(client.get());
    im::ConversationListModel convs(client.get());
    QCOMPARE(messages.count(), 1);
    QCOMPARE(outbox.depth(), 1);
    client->disconnect();
    client.reset();
    QCOMPARE(messages.client(), nullptr);
    QCOMPARE(messages.count(), 0);
    QCOMPARE(outbox.client(), nullptr);
    QCOMPARE(outbox.depth(), 0);
    QCOMPARE(outbox.rowCount(), 0);
    QCOMPARE(convs.client(), nullptr);
    QCOMPARE(convs.count(), 0);
}

void TestApi::search_result_is_a_value_with_a_private_part() {
    // 2.2.0: SearchResult is one pointer to its private part (a later
    // version can tell more about a result); TextRange stays two ints.
    static_assert(sizeof(im::SearchResult) == sizeof(void *), "SearchResult is a d-pointer only");
    static_assert(sizeof(im::TextRange) == 2 * sizeof(int), "TextRange is two ints");
    const im::SearchResult empty;
    QVERIFY(empty.conv().isEmpty());
    QCOMPARE(empty.seq(), 0);
    QCOMPARE(empty.position(), 0);
    QVERIFY(empty.matches().isEmpty());
    // Gadgets: QML (and QVariant users) read the same names as properties.
    const QMetaObject &mo = im::SearchResult::staticMetaObject;
    for (const char *name : {"conv", "seq", "sender", "ts", "body", "matches", "snippet", "snippetMatches", "position"})
        QVERIFY2(mo.indexOfProperty(name) >= 0, name);
    const im::TextRange range{3, 4};
    const QMetaObject &rm = im::TextRange::staticMetaObject;
    QCOMPARE(rm.property(rm.indexOfProperty("start")).readOnGadget(&range).toInt(), 3);
    QCOMPARE(rm.property(rm.indexOfProperty("length")).readOnGadget(&range).toInt(), 4);
    const im::SearchResult copy = empty; // implicitly shared
    QCOMPARE(copy.body(), empty.body());
}

void TestApi::outbox_entry_is_a_value_with_a_private_part() {
    // The ABI: one pointer to the private part, nothing else, so a later
    // version can tell more about an entry without changing its size.
    static_assert(sizeof(im::OutboxEntry) == sizeof(void *), "OutboxEntry is a d-pointer only");
    QTemporaryDir dir;
    Client client;
    QVERIFY(client.open(dir.filePath(QStringLiteral("a.db"))));
    const QString cmid = client.send(QStringLiteral("c1"), QStringLiteral("queued"));
    QVERIFY(!cmid.isEmpty());
    const QList<im::OutboxEntry> entries = client.outbox();
    QCOMPARE(entries.size(), 1);
    const im::OutboxEntry e = entries.first();
    QCOMPARE(e.cmid(), cmid);
    QCOMPARE(e.conv(), QStringLiteral("c1"));
    QCOMPARE(e.kind(), QStringLiteral("send"));
    QCOMPARE(e.body(), QStringLiteral("queued"));
    QCOMPARE(e.target(), 0);
    QCOMPARE(e.attempts(), 0);
    QVERIFY(e.lastError().isEmpty());
    QVERIFY(!e.nextRetryAt().isValid());
    QVERIFY(e.createdAt().isValid());
    QVERIFY(!e.isInFlight());
    QVERIFY(e.prev().isEmpty());
    QVERIFY(!e.isHeld());

    // A value: default-constructed empty, copied and assigned, in a QVariant.
    im::OutboxEntry other;
    QVERIFY(other.cmid().isEmpty());
    QCOMPARE(other.attempts(), 0);
    other = e;
    QCOMPARE(other.cmid(), cmid);
    const QVariant v = QVariant::fromValue(e);
    QCOMPARE(v.value<im::OutboxEntry>().body(), QStringLiteral("queued"));

    // A gadget with the property names QML reads (entry.cmid, entry.held, ...).
    const QMetaObject &mo = im::OutboxEntry::staticMetaObject;
    for (const char *name : {"cmid", "conv", "kind", "body", "target", "attempts", "lastError", "nextRetryAt",
                             "createdAt", "inFlight", "prev", "held"})
        QVERIFY2(mo.indexOfProperty(name) >= 0, name);
    QCOMPARE(mo.property(mo.indexOfProperty("cmid")).readOnGadget(&e).toString(), cmid);
    QCOMPARE(mo.property(mo.indexOfProperty("held")).readOnGadget(&e).toBool(), false);
    QCOMPARE(mo.property(mo.indexOfProperty("createdAt")).readOnGadget(&e).toDateTime(), e.createdAt());
}

void TestApi::every_setting_has_a_getter_and_a_property() {
    Client client;
    // The documented defaults, through the getters.
    QCOMPARE(client.retryBackoffInitial(), 250);
    QCOMPARE(client.retryBackoffMax(), 30000);
    QCOMPARE(client.reconnectBackoffInitial(), 500);
    QCOMPARE(client.reconnectBackoffMax(), 30000);
    QCOMPARE(client.syncPageSize(), 100);
    QCOMPARE(client.historyWindow(), 100);
    QCOMPARE(client.backlogLimit(), 1000);

    // Each setting as a property (what QML uses): written, read back, announced.
    const QList<QUrl> urls{QUrl(QStringLiteral("ws://127.0.0.1:1/v1/ws"))};
    const QList<std::pair<const char *, QVariant>> settings{
        {"servers", QVariant::fromValue(urls)}, {"requestTimeout", 1234}, {"sendWindow", 8},
        {"pingInterval", 3000}, {"silenceTimeout", 9000}, {"retryBackoffInitial", 100},
        {"retryBackoffMax", 5000}, {"reconnectBackoffInitial", 200}, {"reconnectBackoffMax", 7000},
        {"syncPageSize", 50}, {"historyWindow", 30}, {"backlogLimit", 0},
    };
    const QMetaObject *mo = client.metaObject();
    for (const auto &[name, value] : settings) {
        const QMetaProperty p = mo->property(mo->indexOfProperty(name));
        QVERIFY2(p.isValid() && p.isReadable() && p.isWritable() && p.hasNotifySignal(), name);
        QSignalSpy announced(&client, p.notifySignal());
        QVERIFY2(client.setProperty(name, value), name);
        QCOMPARE(client.property(name), value);
        QVERIFY2(announced.size() == 1, name);
        QVERIFY(client.setProperty(name, value)); // the same value again: no signal
        QVERIFY2(announced.size() == 1, name);
    }
    // The getters agree with what the properties wrote.
    QCOMPARE(client.servers(), urls);
    QCOMPARE(client.retryBackoffInitial(), 100);
    QCOMPARE(client.retryBackoffMax(), 5000);
    QCOMPARE(client.reconnectBackoffInitial(), 200);
    QCOMPARE(client.reconnectBackoffMax(), 7000);
    QCOMPARE(client.syncPageSize(), 50);
    QCOMPARE(client.historyWindow(), 30);
    QCOMPARE(client.backlogLimit(), 0);
    // Out of range: clamped as the setters document; initial <= max is kept.
    client.setSyncPageSize(1000);
    QCOMPARE(client.syncPageSize(), 200);
    client.setHistoryWindow(0);
    QCOMPARE(client.historyWindow(), 1);
    client.setRetryBackoffMax(50);
    QCOMPARE(client.retryBackoffMax(), 50);
    QCOMPARE(client.retryBackoffInitial(), 50);
    client.setReconnectBackoffInitial(9000);
    QCOMPARE(client.reconnectBackoffInitial(), 9000);
    QCOMPARE(client.reconnectBackoffMax(), 9000);
}

namespace {

// Qt's complaints about an object used from a thread it does not live in
// ("Timers cannot be started from another thread", "Cannot create children
// for a parent that is in a different thread", socket notifiers, ...).
QMutex threadWarningsMutex;
QStringList threadWarnings;
QtMessageHandler previousHandler = nullptr;
void recordThreadWarnings(QtMsgType type, const QMessageLogContext &context, const QString &message) {
    if (type != QtDebugMsg && type != QtInfoMsg && message.contains(QLatin1String("thread"), Qt::CaseInsensitive)) {
        QMutexLocker lock(&threadWarningsMutex);
        threadWarnings.append(message);
    }
    previousHandler(type, context, message);
}

} // namespace

void TestApi::a_client_lives_on_a_worker_thread() {
    QTemporaryDir dir;
    FakeServer server; // on this thread
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    // The first send is answered UNAVAILABLE: only the outbox's retry timer
    // (a timer of one of the client's parts) gets it resent, on the worker.
    server.unavailable[QStringLiteral("send")] = 1;
    previousHandler = qInstallMessageHandler(recordThreadWarnings);
    auto restore = qScopeGuard([] { qInstallMessageHandler(previousHandler); });

    // Created here, configured, then moved: the usual way to a worker.
    QThread worker;
    worker.start();
    auto *client = new Client;
    client->setServers({server.url()});
    client->setCredentials(QStringLiteral("tok-ana"));
    client->setReconnectBackoff(40, 200);
    client->setRequestTimeout(300);
    client->setRetryBackoff(20, 40);
    client->moveToThread(&worker);
    connect(&worker, &QThread::finished, client, &QObject::deleteLater);
    auto stop = qScopeGuard([&worker] {
        worker.quit();
        worker.wait();
    });
    QCOMPARE(client->thread(), &worker);
    const QList<QObject *> parts = client->findChildren<QObject *>();
    QVERIFY(parts.size() >= 5); // the private part, the parts, their timers
    for (QObject *o : parts)
        QVERIFY2(o->thread() == &worker, o->metaObject()->className());

    // What the client says arrives here queued (this object's thread).
    QList<ConnectionState> states;
    QHash<QString, MessageState> settled;
    // The lambdas' context: destroyed before `stop` runs, so what the client
    // says while it is destroyed on the worker (queued here) never reaches
    // these locals after the test returned.
    QObject receiver;
    connect(client, &Client::connectionStateChanged, &receiver, [&states](ConnectionState s) { states.append(s); });
    connect(client, &Client::messageStateChanged, &receiver,
            [&settled](const QString &, const QString &cmid, qint64, MessageState st, const QString &) {
                settled.insert(cmid, st);
            });
    bool opened = false;
    QMetaObject::invokeMethod(
        client,
        [client, &opened, &dir] {
            opened = client->open(dir.filePath(QStringLiteral("worker.db")));
            client->connectToServer();
        },
        Qt::BlockingQueuedConnection);
    QVERIFY(opened);
    QTRY_VERIFY(states.contains(ConnectionState::Connected));
    QString cmid;
    QMetaObject::invokeMethod(
        client, [client, &cmid] { cmid = client->send(QStringLiteral("c1"), QStringLiteral("from a worker")); },
        Qt::BlockingQueuedConnection);
    QVERIFY(!cmid.isEmpty());
    QTRY_COMPARE(settled.value(cmid, MessageState::Pending), MessageState::Sent);
    QCOMPARE(server.convs[QStringLiteral("c1")].head(), 1); // resent with the same key: stored once
    QVERIFY2(server.requests(QStringLiteral("send")).size() >= 2, "the UNAVAILABLE send was retried by the client's own timer");
    // Everything it made on the way (the socket, ...) is in its tree, on the worker.
    bool socketMoved = false;
    QMetaObject::invokeMethod(
        client,
        [client, &socketMoved] {
            const QList<QObject *> all = client->findChildren<QObject *>();
            socketMoved = std::all_of(all.begin(), all.end(), [](QObject *o) { return o->thread() == QThread::currentThread(); })
                          && std::any_of(all.begin(), all.end(),
                                         [](QObject *o) { return o->inherits("QWebSocket"); });
        },
        Qt::BlockingQueuedConnection);
    QVERIFY(socketMoved);
    {
        QMutexLocker lock(&threadWarningsMutex);
        QVERIFY2(threadWarnings.isEmpty(), qPrintable(threadWarnings.join(u'\n')));
    }

    // Moved with its store open: its SQLite connection stays with the old
    // thread, and the client says so where it happens (docs/sdk.md).
    Client moved;
    QVERIFY(moved.open(dir.filePath(QStringLiteral("opened.db"))));
    moved.moveToThread(&worker);
    QThread *here = QThread::currentThread();
    QMetaObject::invokeMethod(&moved, [&moved, here] { moved.moveToThread(here); }, Qt::BlockingQueuedConnection);
    QCOMPARE(moved.thread(), here);
    QMutexLocker lock(&threadWarningsMutex);
    QVERIFY2(threadWarnings.size() == 2 && threadWarnings.at(0).contains(QLatin1String("with its store open")),
             qPrintable(threadWarnings.join(u'\n')));
}

namespace {

// What the SDK logged under im.sdk.sync (an app's log pane sees the same).
QMutex syncLogMutex;
QStringList syncLog;
QtMessageHandler handlerBeforeSyncLog = nullptr;
void recordSyncLog(QtMsgType type, const QMessageLogContext &context, const QString &message) {
    if (context.category && qstrcmp(context.category, "im.sdk.sync") == 0) {
        QMutexLocker lock(&syncLogMutex);
        syncLog.append(message);
    }
    handlerBeforeSyncLog(type, context, message);
}
bool syncLogged(const QString &part) {
    QMutexLocker lock(&syncLogMutex);
    return std::any_of(syncLog.cbegin(), syncLog.cend(), [&part](const QString &m) { return m.contains(part); });
}

} // namespace

void TestApi::sync_logs_windows_gaps_and_resets() {
    // At the default level (info, what the demo's log pane shows): a
    // history window and its gap, then a rebuild after EPOCH_CHANGED.
    QTemporaryDir dir;
    FakeServer server;
    QVERIFY(server.listen());
    server.convs[QStringLiteral("c1")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
    for (int i = 0; i < 30; ++i)
        server.append(QStringLiteral("c1"), QStringLiteral("ben"), QStringLiteral("m%1").arg(i));
    handlerBeforeSyncLog = qInstallMessageHandler(recordSyncLog);
    auto restore = qScopeGuard([] { qInstallMessageHandler(handlerBeforeSyncLog); });
    Client client;
    client.setServers({server.url()});
    client.setCredentials(QStringLiteral("tok-ana"));
    client.setBacklogLimit(10);
    client.setHistoryWindow(5);
    QVERIFY(client.open(dir.filePath(QStringLiteral("a.db"))));
    QSignalSpy synced(&client, &Client::conversationSynced);
    client.connectToServer();
    QTRY_VERIFY(synced.size() >= 1);
    QVERIFY2(syncLogged(QStringLiteral("c1: 30 events behind")), qPrintable(syncLog.join(u'\n')));
    QVERIFY2(syncLogged(QStringLiteral("c1: window of 5 events stored up to head 30; gap from seq 1")),
             qPrintable(syncLog.join(u'\n')));

    QSignalSpy reset(&client, &Client::conversationReset);
    server.bumpEpoch(QStringLiteral("c1"));
    client.sync(QStringLiteral("c1"));
    QTRY_VERIFY(reset.size() >= 1);
    QVERIFY2(syncLogged(QStringLiteral("c1: EPOCH_CHANGED")), qPrintable(syncLog.join(u'\n')));
    QVERIFY(syncLogged(QStringLiteral("rebuilding from seq 0")));
}

QTEST_GUILESS_MAIN(TestApi)
#include "tst_api.moc"
