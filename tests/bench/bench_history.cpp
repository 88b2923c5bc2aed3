// bench_history: opening a long conversation on a fresh install, with history
// windows (the default) and with a full sync (backlog limit off), against the
// real imserver. Prints figures; not a test (docs/benchmarks.md).
//   bench_history [--events N] (default 100000)
#include "realserver.h"

#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QFileInfo>
#include <QtCore/QTemporaryDir>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlQuery>
#include <QtTest/QSignalSpy>

#include <cstdio>

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
    p.start(QStringLiteral(IM_SEED_BIN), QStringList{server.dbUrl()} + args);
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
};

Figures run(RealServer &server, const QString &dbPath, const QString &conv, int backlogLimit, qint64 events) {
    Figures f;
    const long rss0 = rssKiB();
    QElapsedTimer t;
    t.start();
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
        QSignalSpy synced(&client, &im::Client::conversationSynced);
        client.connectToServer();
        im::MessageListModel model(&client, conv);
        // Opened = its newest window is on screen and the conversation is synced.
        if (!QTest::qWaitFor([&] { return synced.contains(QVariantList{conv}) && model.count() >= model.windowRows(); },
                             1800000))
            std::fprintf(stderr, "the conversation did not open within 30 minutes\n");
        f.openMs = double(t.nsecsElapsed()) / 1e6;
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
    const QStringList args = app.arguments();
    for (int i = 1; i < args.size(); ++i) {
        if (args[i] == u"--events" && i + 1 < args.size())
            events = args[++i].toLongLong();
        else {
            std::fprintf(stderr, "usage: bench_history [--events N]\n");
            return 2;
        }
    }
    RealServer server(QStringLiteral(IM_SERVER_BIN));
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
        const Figures f = run(server, dir.filePath(QStringLiteral("b%1.db").arg(n++)), conv, m.backlog, events);
        std::printf("%-34s %12.0f %14ld %14lld %12lld %18ld\n", m.name, f.openMs, f.rssDeltaKiB, f.localEvents,
                    f.dbBytes / 1024, f.rssAllRowsKiB);
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
