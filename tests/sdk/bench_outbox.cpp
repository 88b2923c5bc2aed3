// Outbox benchmark (not a timed test; run by hand, figures go to docs/sdk.md).
//
//  1. durable enqueues/s of Client::send() against raw SQLite single-row
//     transactions with the same pragmas (WAL, synchronous=FULL), same run,
//     same file system; prints both and the ratio (goal: <= 1.5x).
//  1b. latency per call, p50/p99 (issue 48, "one flush per send"): a raw
//     durable insert; send() with no session (the call alone); send() in a
//     connected session (in-process fake server), the call plus the
//     event-loop turn that puts the frame on the wire (the on-the-wire mark),
//     i.e. what one message costs the client's thread; each as a ratio
//     against the raw insert's p50 of the same run; and, as a diagnostic, the
//     connected call with the previous message's relaxed settle flushed
//     before it (what that settle adds to the next send's flush).
//  2. with the real server (built in the same tree): time to resend 10,000
//     pending messages after connect.
//
// Usage: bench_outbox [--count N] [--resend N] [--dir DIR] [--no-server]
#ifdef IM_SERVER_BIN
#include "exerelative.h"
#include "realserver.h"
#endif

#include "fakeserver.h"

#include <im/client.h>

#include <QtCore/QCommandLineParser>
#include <QtCore/QCoreApplication>
#include <QtCore/QElapsedTimer>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUuid>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlError>
#include <QtSql/QSqlQuery>
#include <QtTest/QtTest>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

namespace {

struct Latency {
    double p50 = 0, p99 = 0; // microseconds
};

Latency percentiles(std::vector<qint64> ns) { // by value: sorted here
    Latency l;
    if (ns.empty())
        return l;
    std::sort(ns.begin(), ns.end());
    l.p50 = double(ns[ns.size() / 2]) / 1000.0;
    l.p99 = double(ns[std::min(ns.size() - 1, ns.size() * 99 / 100)]) / 1000.0;
    return l;
}

// The three sides of the latency measure, each kept open for the whole run
// and sampled in alternating blocks (the load of a shared machine changes by
// the second, so sides measured one after the other are not comparable).

// One durable single-row insert per transaction.
class RawSide {
public:
    explicit RawSide(const QString &path) {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("rawlat"));
        db.setDatabaseName(path);
        if (!db.open())
            qFatal("raw open: %s", qPrintable(db.lastError().text()));
        QSqlQuery q(db);
        q.exec(QStringLiteral("PRAGMA journal_mode=WAL"));
        q.finish();
        q.exec(QStringLiteral("PRAGMA synchronous=FULL"));
        q.exec(QStringLiteral("CREATE TABLE outbox(id INTEGER PRIMARY KEY AUTOINCREMENT, cmid TEXT NOT NULL UNIQUE,"
                              " kind TEXT NOT NULL, conv TEXT NOT NULL, body TEXT, created_at INTEGER NOT NULL)"));
        ins_ = QSqlQuery(db);
        ins_.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, created_at) VALUES(?, 'send', ?, ?, ?)"));
    }
    ~RawSide() {
        ins_ = QSqlQuery();
        QSqlDatabase::database(QStringLiteral("rawlat"), false).close();
        QSqlDatabase::removeDatabase(QStringLiteral("rawlat"));
    }
    void sample() {
        QSqlDatabase db = QSqlDatabase::database(QStringLiteral("rawlat"), false);
        QElapsedTimer t;
        t.start();
        if (!db.transaction())
            qFatal("raw begin: %s", qPrintable(db.lastError().text()));
        ins_.addBindValue(QUuid::createUuid().toString(QUuid::WithoutBraces));
        ins_.addBindValue(QStringLiteral("team"));
        ins_.addBindValue(QStringLiteral("benchmark message %1").arg(samples.size()));
        ins_.addBindValue(QDateTime::currentMSecsSinceEpoch());
        if (!ins_.exec())
            qFatal("raw insert: %s", qPrintable(ins_.lastError().text()));
        ins_.finish();
        if (!db.commit())
            qFatal("raw commit: %s", qPrintable(db.lastError().text()));
        samples.push_back(t.nsecsElapsed());
    }
    std::vector<qint64> samples;

private:
    QSqlQuery ins_;
};

// send() with no session: the call alone.
class OfflineSide {
public:
    explicit OfflineSide(const QString &path) {
        if (!client_.open(path))
            qFatal("open: %s", qPrintable(client_.lastError()));
    }
    void sample() {
        QElapsedTimer t;
        t.start();
        if (client_.send(QStringLiteral("team"), QStringLiteral("benchmark message %1").arg(samples.size())).isEmpty())
            qFatal("send failed: %s", qPrintable(client_.lastError()));
        samples.push_back(t.nsecsElapsed());
    }
    std::vector<qint64> samples;

private:
    im::Client client_;
};

// send() in a connected session (in-process fake server), one message at a
// time from an idle client: `call` is send() alone; `turn` is send() plus the
// posted events it queued (the pump that marks the entry as on the wire and
// hands the frame to the socket): the client thread's whole durable cost of
// one message.
//
// With `flushSettle` (a diagnostic side, not a target): after the answer is
// settled, and untimed, a durable one-row write from a second connection to
// the same file. The settle's writes (answer, event, cursor) are relaxed
// (synchronous=NORMAL): without this they ride the WAL flush of the next
// send(); with it, that flush is paid before the call, so the call flushes
// only its own frames. The gap between the two connected sides is what the
// previous message's settle adds to a send.
class ConnectedSide {
public:
    explicit ConnectedSide(const QString &path, bool flushSettle = false) : flushSettle_(flushSettle), path_(path) {
        if (!server_.listen())
            qFatal("fake server: cannot listen");
        server_.convs[QStringLiteral("team")].members = {QStringLiteral("ana"), QStringLiteral("ben")};
        client_.setServers({server_.url()});
        client_.setCredentials(QStringLiteral("tok-ana"));
        client_.setRequestTimeout(600000);
        if (!client_.open(path))
            qFatal("open: %s", qPrintable(client_.lastError()));
        client_.connectToServer();
        if (!QTest::qWaitFor([&] { return client_.connectionState() == im::ConnectionState::Connected; }, 10000))
            qFatal("fake server: no session");
        QTest::qWait(200); // the session's first requests (sub, convs) answered
    }
    ~ConnectedSide() {
        if (QSqlDatabase::contains(QStringLiteral("settleflush")) && flushSettle_) {
            QSqlDatabase::database(QStringLiteral("settleflush"), false).close();
            QSqlDatabase::removeDatabase(QStringLiteral("settleflush"));
        }
    }
    void sample() {
        QElapsedTimer t;
        t.start();
        const QString cmid =
            client_.send(QStringLiteral("team"), QStringLiteral("benchmark message %1").arg(call.size()));
        const qint64 afterCall = t.nsecsElapsed();
        QCoreApplication::sendPostedEvents();
        const qint64 afterTurn = t.nsecsElapsed();
        if (cmid.isEmpty())
            qFatal("send failed: %s", qPrintable(client_.lastError()));
        call.push_back(afterCall);
        turn.push_back(afterTurn);
        const QList<im::OutboxEntry> entries = client_.outbox();
        if (entries.isEmpty() || !entries.constLast().isInFlight())
            ++notOnWire;
        // Untimed: wait for the answer, so the next send starts from idle.
        if (!QTest::qWaitFor([&] { return client_.pendingCount() == 0; }, 10000))
            qFatal("no answer for message %zu", call.size());
        if (flushSettle_)
            flushWal();
    }
    std::vector<qint64> call, turn;
    int notOnWire = 0; // messages the turn did not put on the wire (should be 0)

private:
    // A durable write from another connection: its commit flushes the WAL
    // up to its own frame, so every relaxed frame before it too.
    void flushWal() {
        const QString name = QStringLiteral("settleflush");
        if (!QSqlDatabase::contains(name)) {
            QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
            db.setDatabaseName(path_);
            if (!db.open())
                qFatal("flush open: %s", qPrintable(db.lastError().text()));
            QSqlQuery q(db);
            q.exec(QStringLiteral("PRAGMA synchronous=FULL"));
            q.exec(QStringLiteral("CREATE TABLE IF NOT EXISTS bench_settle_flush(n INTEGER)"));
        }
        QSqlQuery q(QSqlDatabase::database(name, false));
        if (!q.exec(QStringLiteral("INSERT INTO bench_settle_flush(n) VALUES(1)")))
            qFatal("flush write: %s", qPrintable(q.lastError().text()));
    }
    bool flushSettle_ = false;
    QString path_;
    FakeServer server_;
    im::Client client_;
};

} // namespace

static double rawInserts(const QString &path, int n) {
    double rate = 0;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), QStringLiteral("raw"));
        db.setDatabaseName(path);
        if (!db.open())
            qFatal("raw open: %s", qPrintable(db.lastError().text()));
        QSqlQuery q(db);
        q.exec(QStringLiteral("PRAGMA journal_mode=WAL"));
        q.finish();
        q.exec(QStringLiteral("PRAGMA synchronous=FULL"));
        q.exec(QStringLiteral("CREATE TABLE outbox(id INTEGER PRIMARY KEY AUTOINCREMENT, cmid TEXT NOT NULL UNIQUE,"
                              " kind TEXT NOT NULL, conv TEXT NOT NULL, body TEXT, created_at INTEGER NOT NULL)"));
        QSqlQuery ins(db);
        ins.prepare(QStringLiteral("INSERT INTO outbox(cmid, kind, conv, body, created_at) VALUES(?, 'send', ?, ?, ?)"));
        QElapsedTimer t;
        t.start();
        for (int i = 0; i < n; ++i) {
            if (!db.transaction())
                qFatal("raw begin: %s", qPrintable(db.lastError().text()));
            ins.addBindValue(QUuid::createUuid().toString(QUuid::WithoutBraces));
            ins.addBindValue(QStringLiteral("team"));
            ins.addBindValue(QStringLiteral("benchmark message %1").arg(i));
            ins.addBindValue(QDateTime::currentMSecsSinceEpoch());
            if (!ins.exec())
                qFatal("raw insert: %s", qPrintable(ins.lastError().text()));
            ins.finish();
            if (!db.commit())
                qFatal("raw commit: %s", qPrintable(db.lastError().text()));
        }
        rate = n * 1000.0 / std::max<qint64>(1, t.elapsed());
        db.close();
    }
    QSqlDatabase::removeDatabase(QStringLiteral("raw"));
    return rate;
}

static double clientSends(const QString &path, int n) {
    im::Client client;
    if (!client.open(path))
        qFatal("open: %s", qPrintable(client.lastError()));
    QElapsedTimer t;
    t.start();
    for (int i = 0; i < n; ++i)
        if (client.send(QStringLiteral("team"), QStringLiteral("benchmark message %1").arg(i)).isEmpty())
            qFatal("send failed: %s", qPrintable(client.lastError()));
    return n * 1000.0 / std::max<qint64>(1, t.elapsed());
}

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    QCommandLineParser p;
    p.addHelpOption();
    p.addOption({QStringLiteral("count"), QStringLiteral("enqueues per side"), QStringLiteral("n"), QStringLiteral("2000")});
    p.addOption({QStringLiteral("resend"), QStringLiteral("messages for the resend run"), QStringLiteral("n"), QStringLiteral("10000")});
    p.addOption({QStringLiteral("dir"), QStringLiteral("directory for the databases"), QStringLiteral("dir")});
    p.addOption({QStringLiteral("latency"), QStringLiteral("calls per latency measure"), QStringLiteral("n"),
                 QStringLiteral("1000")});
    p.addOption({QStringLiteral("no-server"), QStringLiteral("skip the real-server resend run")});
    p.addOption({QStringLiteral("baseline"),
                 QStringLiteral("messages for the same run's baseline: one request on the wire at a time (0: none)"),
                 QStringLiteral("n"), QStringLiteral("1000")});
    p.process(app);
    const int n = p.value(QStringLiteral("count")).toInt();

    QTemporaryDir tmp(p.isSet(QStringLiteral("dir")) ? p.value(QStringLiteral("dir")) + QStringLiteral("/bench-XXXXXX")
                                                     : QString());
    // Warm-up, then raw / send / raw / send; report the medians of each pair.
    rawInserts(tmp.filePath(QStringLiteral("warm.db")), 200);
    const double raw1 = rawInserts(tmp.filePath(QStringLiteral("raw1.db")), n);
    const double send1 = clientSends(tmp.filePath(QStringLiteral("sdk1.db")), n);
    const double raw2 = rawInserts(tmp.filePath(QStringLiteral("raw2.db")), n);
    const double send2 = clientSends(tmp.filePath(QStringLiteral("sdk2.db")), n);
    const double raw = (raw1 + raw2) / 2, send = (send1 + send2) / 2;
    std::printf("durable enqueue, %d each, WAL + synchronous=FULL, in %s\n", n, qPrintable(tmp.path()));
    std::printf("  raw SQLite insert+commit : %8.0f /s  (runs: %.0f, %.0f)\n", raw, raw1, raw2);
    std::printf("  im::Client::send()       : %8.0f /s  (runs: %.0f, %.0f)\n", send, send1, send2);
    std::printf("  cost ratio send/raw      : %8.2fx (goal <= 1.5x)\n", raw / send);
    std::fflush(stdout);

    {
        const int l = p.value(QStringLiteral("latency")).toInt();
        RawSide raw(tmp.filePath(QStringLiteral("rawlat.db")));
        OfflineSide offline(tmp.filePath(QStringLiteral("offlat.db")));
        ConnectedSide connected(tmp.filePath(QStringLiteral("conlat.db")));
        ConnectedSide flushed(tmp.filePath(QStringLiteral("conflush.db")), true);
        constexpr int block = 20;
        for (int done = 0; done < l; done += block) {
            const int k = std::min(block, l - done);
            for (int i = 0; i < k; ++i)
                raw.sample();
            for (int i = 0; i < k; ++i)
                offline.sample();
            for (int i = 0; i < k; ++i)
                connected.sample();
            for (int i = 0; i < k; ++i)
                flushed.sample();
        }
        const Latency rawL = percentiles(raw.samples), offL = percentiles(offline.samples);
        const Latency callL = percentiles(connected.call), turnL = percentiles(connected.turn);
        const double r50 = rawL.p50, r99 = rawL.p99;
        std::printf("latency per call, %d each in alternating blocks of %d, p50 / p99 in microseconds"
                    " (ratio: p50 / raw p50, p99 / raw p99)\n", l, block);
        std::printf("  raw durable insert                : %8.0f / %8.0f\n", r50, r99);
        std::printf("  send(), no session                : %8.0f / %8.0f  %5.2fx / %5.2fx\n", offL.p50, offL.p99,
                    offL.p50 / r50, offL.p99 / r99);
        std::printf("  send(), connected: the call       : %8.0f / %8.0f  %5.2fx / %5.2fx\n", callL.p50,
                    callL.p99, callL.p50 / r50, callL.p99 / r99);
        std::printf("  send(), connected: call + on wire : %8.0f / %8.0f  %5.2fx / %5.2fx  (target: one durable insert)%s\n",
                    turnL.p50, turnL.p99, turnL.p50 / r50, turnL.p99 / r99,
                    connected.notOnWire ? qPrintable(QStringLiteral(" [%1 not on the wire after the turn]").arg(connected.notOnWire))
                                   : "");
        const Latency flushL = percentiles(flushed.call);
        std::printf("  diagnostic: the call, the previous settle flushed first : %8.0f / %8.0f  %5.2fx / %5.2fx\n",
                    flushL.p50, flushL.p99, flushL.p50 / r50, flushL.p99 / r99);
        std::fflush(stdout);
    }

#ifdef IM_SERVER_BIN
    if (!p.isSet(QStringLiteral("no-server"))) {
        const int m = p.value(QStringLiteral("resend")).toInt();
        const int b = p.value(QStringLiteral("baseline")).toInt();
        RealServer server(exeRelativePath(IM_SERVER_BIN));
        const QString error = server.start();
        if (!error.isEmpty()) {
            std::printf("real server unavailable: %s\n", qPrintable(error));
            return 1;
        }
        // n pending messages of one conversation, then a connect: the time
        // from the welcome to an empty outbox, with `window` requests on the
        // wire at most (1: the old one-at-a-time order).
        struct Flush { double rate = 0; qint64 ms = 0, helloMs = 0; double cpuMs = 0; bool done = false; };
        const auto flush = [&](const QString &db, int n, int window) {
            Flush f;
            im::Client client;
            client.setServers({server.url});
            client.setCredentials(server.tokens.value(QStringLiteral("ana")));
            client.setRequestTimeout(30000);
            client.setSendWindow(window);
            if (!client.open(tmp.filePath(db)))
                qFatal("open: %s", qPrintable(client.lastError()));
            for (int i = 0; i < n; ++i)
                client.send(QStringLiteral("team"), QStringLiteral("resend benchmark %1 %2").arg(db).arg(i));
            QElapsedTimer t;
            t.start();
            const std::clock_t cpu0 = std::clock();
            qint64 connectedAt = -1;
            QObject::connect(&client, &im::Client::connectionStateChanged, [&](im::ConnectionState s) {
                if (s == im::ConnectionState::Connected && connectedAt < 0)
                    connectedAt = t.elapsed();
            });
            client.connectToServer();
            // A real event loop, as an app runs it (QTest::qWaitFor sleeps 10 ms
            // between its passes, which paced the flush at ~3 passes a message).
            QEventLoop loop;
            QTimer::singleShot(600000, &loop, &QEventLoop::quit);
            QObject::connect(&client, &im::Client::outboxChanged, &loop, [&] {
                if (client.pendingCount() == 0)
                    loop.quit();
            });
            if (client.pendingCount() > 0)
                loop.exec();
            f.done = client.pendingCount() == 0;
            f.helloMs = std::max<qint64>(0, connectedAt);
            f.ms = std::max<qint64>(1, t.elapsed() - f.helloMs);
            f.cpuMs = double(std::clock() - cpu0) * 1000.0 / CLOCKS_PER_SEC;
            f.rate = n * 1000.0 / f.ms;
            return f;
        };
        Flush base;
        if (b > 0) {
            base = flush(QStringLiteral("baseline.db"), b, 1);
            std::printf("baseline, one request on the wire: %d pending -> 0 in %lld ms (%.0f msg/s)%s\n", b,
                        static_cast<long long>(base.ms), base.rate, base.done ? "" : " [DID NOT FINISH]");
        }
        const Flush r = flush(QStringLiteral("resend.db"), m, 128);
        std::printf("resend after reconnect, real server: %d pending -> 0 in %lld ms (%.0f msg/s; hello after %lld ms)%s\n",
                    m, static_cast<long long>(r.ms), r.rate, static_cast<long long>(r.helloMs),
                    r.done ? "" : " [DID NOT FINISH]");
        if (b > 0)
            std::printf("  pipelined flush against the one-at-a-time baseline: %.1fx (goal: >= 2,000 msg/s)\n",
                        r.rate / std::max(1.0, base.rate));
        // The SDK's own share: if it is small, the server and its database set the pace.
        std::printf("  client process CPU during the resend: %.0f ms (%.0f%% of the wall time)\n", r.cpuMs,
                    100.0 * r.cpuMs / double(r.ms + r.helloMs));
        return r.done && (b == 0 || base.done) ? 0 : 1;
    }
#endif
    return 0;
}
