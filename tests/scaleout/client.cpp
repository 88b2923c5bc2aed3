// The SDK side of the scale-out lab: a real im::Client in its own process,
// connected through the load balancer, sending under whatever the lab does
// to the gateways and the database. One stdout line per fact:
//
//   im_scaleout_client DB URL TOKEN CONV PREFIX INTERVAL_MS STOPFILE
//
//   SENT <cmid> <body>       send() returned (the draft is in the durable outbox)
//   ACK <cmid> <seq>         the server acknowledged it (MessageState::Sent)
//   FAILED <cmid> <code>     a terminal error (the lab counts it as a failure)
//   RETRY <cmid> <error> <n> attempt n was answered with a retryable error
//                            (OutboxEntry::lastError: UNAVAILABLE, TIMEOUT,
//                            DISCONNECTED) and the entry waits to be resent
//   GATEWAY <id>             connected (again) to this gateway
//   DRAINED                  STOPFILE appeared, sending stopped, outbox empty
//   CONVERGED <n> <maxseq> <digest>
//                            STOPFILE.sync appeared (the lab creates it once every
//                            client drained) and CONV synced to the server's head:
//                            n msg rows, the highest seq, and FNV-1a over
//                            "seq body\n" of every msg row of the local database
//
// Bodies are PREFIX-1, PREFIX-2, ...: one body per draft, so a message stored
// twice shows as a body stored twice.
#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QFile>
#include <QtCore/QTimer>
#include <QtCore/QUrl>

#include <cstdio>
#include <limits>
#include <map>

namespace {

void say(const QString& line) {
    std::printf("%s\n", qPrintable(line));
    std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
    QCoreApplication app(argc, argv);
    const QStringList a = app.arguments();
    if (a.size() != 8) {
        std::fprintf(stderr, "usage: %s DB URL TOKEN CONV PREFIX INTERVAL_MS STOPFILE\n", argv[0]);
        return 2;
    }
    const QString conv = a[4], prefix = a[5], stopFile = a[7];
    const int interval = a[6].toInt();
    im::Client client;
    client.setServers({QUrl(a[2])});
    client.setCredentials(a[3]);
    client.setRequestTimeout(4000);
    client.setRetryBackoff(100, 1000);
    client.setReconnectBackoff(100, 1000);
    if (!client.open(a[1])) {
        std::fprintf(stderr, "open failed: %s\n", qPrintable(client.lastError()));
        return 1;
    }
    auto* model = new im::MessageListModel(&client, conv, &app);
    model->setWindowRows(std::numeric_limits<int>::max()); // the whole local copy, not a window
    QObject::connect(&client, &im::Client::errorOccurred, [](const QString& code, const QString& msg) {
        std::fprintf(stderr, "error %s: %s\n", qPrintable(code), qPrintable(msg));
    });
    QObject::connect(&client, &im::Client::messageStateChanged, &app,
                     [](const QString&, const QString& cmid, qint64 seq, im::MessageState st, const QString& err) {
                         if (st == im::MessageState::Sent) say(QStringLiteral("ACK %1 %2").arg(cmid).arg(seq));
                         else if (st == im::MessageState::Failed || st == im::MessageState::Expired)
                             say(QStringLiteral("FAILED %1 %2").arg(cmid, err));
                     });

    bool stopping = false, drained = false, syncing = false;
    int next = 0;
    auto* sender = new QTimer(&app);
    auto* waitSync = new QTimer(&app);
    auto finishIfSettled = [&] {
        if (!stopping || client.connectionState() != im::ConnectionState::Connected || client.pendingCount() != 0)
            return;
        if (!drained) {
            drained = true;
            say(QStringLiteral("DRAINED"));
            waitSync->start(50);
        }
        if (syncing) client.sync(conv);
    };
    QObject::connect(waitSync, &QTimer::timeout, &app, [&] {
        if (!QFile::exists(stopFile + QStringLiteral(".sync"))) return;
        waitSync->stop();
        syncing = true;
        client.sync(conv);
    });
    QObject::connect(&client, &im::Client::connectionStateChanged, &app, [&](im::ConnectionState s) {
        if (s != im::ConnectionState::Connected) return; // a cut sync is asked again below
        say(QStringLiteral("GATEWAY ") + client.gatewayId());
        if (!sender->isActive() && !stopping) sender->start(interval);
        finishIfSettled();
    });
    QObject::connect(&client, &im::Client::outboxChanged, &app, finishIfSettled);
    // One RETRY line per failed attempt. An entry already back on the wire
    // (inFlight) carries the error of the attempt before the current one.
    std::map<QString, int> retried; // cmid -> the last attempt reported
    QObject::connect(&client, &im::Client::outboxChanged, &app, [&] {
        std::map<QString, int> still;
        for (const auto& e : client.outbox()) {
            int& reported = still[e.cmid()];
            if (auto it = retried.find(e.cmid()); it != retried.end()) reported = it->second;
            const int failed = e.isInFlight() ? e.attempts() - 1 : e.attempts();
            if (e.lastError().isEmpty() || failed <= reported) continue;
            reported = failed;
            say(QStringLiteral("RETRY %1 %2 %3").arg(e.cmid(), e.lastError()).arg(failed));
        }
        retried.swap(still);
    });
    QObject::connect(sender, &QTimer::timeout, &app, [&] {
        if (QFile::exists(stopFile)) {
            sender->stop();
            stopping = true;
            finishIfSettled();
            return;
        }
        const QString body = QStringLiteral("%1-%2").arg(prefix).arg(++next);
        const QString cmid = client.send(conv, body);
        if (cmid.isEmpty()) {
            std::fprintf(stderr, "send failed: %s\n", qPrintable(client.lastError()));
            QCoreApplication::exit(1);
            return;
        }
        say(QStringLiteral("SENT %1 %2").arg(cmid, body));
    });
    QObject::connect(&client, &im::Client::conversationSynced, &app, [&](const QString& c) {
        if (c != conv || !syncing || client.pendingCount() != 0) return;
        model->refresh();
        std::map<qint64, QString> rows;
        for (int i = 0; i < model->count(); ++i) {
            if (model->get(i, im::MessageListModel::KindRole).toString() != QLatin1String("msg")) continue;
            const qint64 seq = model->get(i, im::MessageListModel::SeqRole).toLongLong();
            if (seq <= 0) return; // a draft still pending locally: not converged yet
            rows[seq] = model->get(i, im::MessageListModel::BodyRole).toString();
        }
        quint64 h = 1469598103934665603ULL;
        for (const auto& [seq, body] : rows)
            for (char ch : (QString::number(seq) + QLatin1Char(' ') + body + QLatin1Char('\n')).toUtf8()) {
                h ^= static_cast<unsigned char>(ch);
                h *= 1099511628211ULL;
            }
        say(QStringLiteral("CONVERGED %1 %2 %3")
                .arg(rows.size())
                .arg(rows.empty() ? 0 : rows.rbegin()->first)
                .arg(h, 16, 16, QLatin1Char('0')));
        QCoreApplication::exit(0);
    });
    // A stray client ends by itself; the lab's longest runs
    // (IM_SCALEOUT_ROUNDS) stay well inside this.
    QTimer::singleShot(1800000, &app, [] {
        std::fprintf(stderr, "client timed out\n");
        QCoreApplication::exit(3);
    });
    client.connectToServer();
    return app.exec();
}
