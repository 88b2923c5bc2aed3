// bench_history: opening a long conversation on a fresh install, with history
// windows (the default) and with a full sync (backlog limit off), against the
// real imserver. Prints figures; not a test (docs/benchmarks.md).
//   bench_history [--events N] [--window-only] (default 100000 events; with
//   --window-only the full sync, which takes tens of minutes, is skipped)
#include "exerelative.h"
#include "realserver.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QEventLoop>
#include <QtCore/QFileInfo>
#include <QtCore/QTemporaryDir>
#include <QtCore/QTimer>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlQuery>
#include <QtTest/QSignalSpy>

#include <cstdio>
#include <ctime>

qint64 sqlEvents(const QString &dbPath, const QString &conv);

namespace {

// Resident set size of this process in KiB (Linux; the benchmark only).
long rssKiB() {
    QFile f(QStringLiteral("/proc/self/status"));
    if (!f.open(QIODevice::ReadOnly))
        return -1;
    for (const QByteArray &line : f.readAll().split('\n'))
        if (line.startsWith("VmRSS:"))
            return line.mid(6).trimmed().split(' ').first().toLong();
    return -1;
}

bool seed(RealServer &server, const QStringList &args) {
    QProcess p;
    p.setProcessChannelMode(QProcess::MergedChannels);
    p.start(exeRelativePath(IM_SEED_BIN), QStringList{server.dbUrl()} + args);
    if (!p.waitForFinished(600000) || p.exitCode() != 0) {
        std::fprintf(stderr, "seed failed: %s\n", p.readAll().constData());
        return false;
    }
    return true;
}

struct Figures {
    double openMs = 0;   // connect -> the model shows its first window
    long rssDeltaKiB = 0;
    qint64 localEvents = 0;
    qint64 dbBytes = 0;
    long rssAllRowsKiB = 0; // after showing every local row (for contrast)
    // Where the open time goes (ms since the start): database opened,
    // welcome, first events of the conversation stored, synced, shown.
    double dbOpenMs = 0, welcomeMs = 0, firstEventsMs = 0, syncedMs = 0;
    double cpuMs = 0; // this process's CPU time (all threads) during the open
};

Figures run(RealServer &server, const QString &dbPath, const QString &conv, int backlogLimit, qint64 events) {
    Figures f;
    const long rss0 = rssKiB();
    QElapsedTimer t;
    t.start();
    const std::clock_t cpu0 = std::clock();
    {
        im::Client client;
        client.setServers({server.url});
        client.setCredentials(server.tokens.value(QStringLiteral("ana")));
        client.setRequestTimeout(60000);
        client.setBacklogLimit(backlogLimit);
        if (!client.open(dbPath)) {
            std::fprintf(stderr, "open failed: %s\n", qPrintable(client.lastError()));
            return f;
        }
        f.dbOpenMs = double(t.nsecsElapsed()) / 1e6;
        QSignalSpy synced(&client, &im::Client::conversationSynced);
        QObject::connect(&client, &im::Client::connectionStateChanged, &client, [&](im::ConnectionState s) {
            if (s == im::ConnectionState::Connected && f.welcomeMs == 0)
                f.welcomeMs = double(t.nsecsElapsed()) / 1e6;
        });
        QObject::connect(&client, &im::Client::eventsApplied, &client, [&](const QString &c) {
            if (c == conv && f.firstEventsMs == 0)
                f.firstEventsMs = double(t.nsecsElapsed()) / 1e6;
        });
        QObject::connect(&client, &im::Client::conversationSynced, &client, [&](const QString &c) {
            if (c == conv && f.syncedMs == 0)
                f.syncedMs = double(t.nsecsElapsed()) / 1e6;
        });
        client.connectToServer();
        im::MessageListModel model(&client, conv);
        // Opened = its newest window is on screen and the conversation is
        // synced. Waited for in a plain event loop, woken by the signals, as
        // an app's would be: QTest::qWaitFor polls every 10 ms, which added
        // up to 10 ms to every step of the open (docs/benchmarks.md).
        QEventLoop loop;
        auto opened = [&] { return synced.contains(QVariantList{conv}) && model.count() >= model.windowRows(); };
        auto check = [&] {
            if (opened())
                loop.quit();
        };
        QObject::connect(&client, &im::Client::conversationSynced, &loop, check, Qt::QueuedConnection);
        QObject::connect(&model, &im::MessageListModel::countChanged, &loop, check, Qt::QueuedConnection);
        QTimer::singleShot(1800000, &loop, &QEventLoop::quit);
        if (!opened())
            loop.exec();
        if (!opened())
            std::fprintf(stderr, "the conversation did not open within 30 minutes\n");
        f.openMs = double(t.nsecsElapsed()) / 1e6;
        f.cpuMs = double(std::clock() - cpu0) * 1000.0 / CLOCKS_PER_SEC;
        f.rssDeltaKiB = rssKiB() - rss0;
        f.localEvents = sqlEvents(dbPath, conv);
        // For contrast: the same model showing every local row.
        model.setWindowRows(int(events) + 10);
        model.fetchMore();
        f.rssAllRowsKiB = rssKiB() - rss0;
        client.disconnectFromServer();
    }
    f.dbBytes = QFileInfo(dbPath).size() + QFileInfo(dbPath + QStringLiteral("-wal")).size();
    return f;
}

} // namespace

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    qint64 events = 100000;
    bool windowOnly = false;
    const QStringList args = app.arguments();
    for (int i = 1; i < args.size(); ++i) {
        if (args[i] == u"--events" && i + 1 < args.size())
            events = args[++i].toLongLong();
        else if (args[i] == u"--window-only")
            windowOnly = true;
        else {
            std::fprintf(stderr, "usage: bench_history [--events N] [--window-only]\n");
            return 2;
        }
    }
    RealServer server(exeRelativePath(IM_SERVER_BIN));
    const QString err = server.start();
    if (!err.isEmpty()) {
        std::fprintf(stderr, "%s\n", qPrintable(err));
        return 1;
    }
    const QString conv = QStringLiteral("bench-100000");
    if (!seed(server, {QStringLiteral("convs"), QStringLiteral("ana"), QStringLiteral("bench"), QStringLiteral("1")})
        || !seed(server, {QStringLiteral("events"), conv, QStringLiteral("ben"), QString::number(events)}))
        return 1;
    QTemporaryDir dir;
    std::printf("conversation of %lld events (+1 join), fresh install each run\n", events);
    std::printf("%-34s %12s %14s %14s %12s %18s\n", "mode", "open (ms)", "RSS +KiB", "local events", "db KiB",
                "RSS +KiB all rows");
    const struct { const char *name; int backlog; } modes[] = {{"history window (default)", 1000},
                                                               {"full sync (setBacklogLimit(0))", 0}};
    int n = 0;
    for (const auto &m : modes) {
        if (windowOnly && m.backlog == 0)
            continue;
        const Figures f = run(server, dir.filePath(QStringLiteral("b%1.db").arg(n++)), conv, m.backlog, events);
        std::printf("%-34s %12.0f %14ld %14lld %12lld %18ld\n", m.name, f.openMs, f.rssDeltaKiB, f.localEvents,
                    f.dbBytes / 1024, f.rssAllRowsKiB);
        std::printf("  (ms from start: database open %.0f, welcome %.0f, first events stored %.0f, synced %.0f, "
                    "shown %.0f; client CPU %.0f ms)\n",
                    f.dbOpenMs, f.welcomeMs, f.firstEventsMs, f.syncedMs, f.openMs, f.cpuMs);
    }
    server.stop();
    return 0;
}

qint64 sqlEvents(const QString &dbPath, const QString &conv) {
    qint64 n = -1;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("bench-probe"));
        db.setDatabaseName(dbPath);
        if (db.open()) {
            QSqlQuery q(db);
            q.prepare(QStringLiteral("SELECT COUNT(*) FROM events WHERE conv = ?"));
            q.addBindValue(conv);
            if (q.exec() && q.next())
                n = q.value(0).toLongLong();
        }
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("bench-probe"));
    return n;
}
