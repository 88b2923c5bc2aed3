// The SDK side of the lab: a real im::Client in its own process, driven by
// arguments, reporting on stdout one line per fact the lab waits for.
//
//   send DB URL TOKEN CONV BODY           connect, send(); print "CMID <cmid>" as
//                                         soon as send() returned; then idle (the
//                                         lab SIGKILLs us)
//   send-inflight DB URL TOKEN CONV BODY  same, but print once the request is on
//                                         the wire (attempts >= 1) and the gateway has
//                                         read it (its send workers took one more run:
//                                         GET /metrics on URL's port), before its reply
//   drain DB URL TOKEN                    connect; print "DRAINED" when the outbox
//                                         is empty, then exit 0
//   watch DB URL TOKEN CONV               connect and sync CONV; print "SYNCED <rows>"
//                                         after every completed sync, "APPLIED <rows>"
//                                         after events were applied (page or push),
//                                         and "RESET" when the SDK drops the conversation
//   soak DB URLS TOKEN CONV COUNT [TAG]   URLS comma-separated gateways; send up to COUNT
//                                         messages with bodies "sdk-<user>-<TAG><n>" ("ASK
//                                         <body>" before send(), "CMID <cmid> <body>" after
//                                         it returned), one per 100 ms,
//                                         through every outage; once the file DB.end
//                                         exists (the soak is over) stop, drain the outbox,
//                                         print "DRAINED"; once DB.sync exists (every
//                                         client drained) sync CONV, print
//                                         "ROW <seq> <kind> <body>" per row ("RECALLED <seq>"
//                                         after a recalled one) and "DONE"
#include <im/client.h>
#include <im/messagelistmodel.h>

#include <QtCore/QCoreApplication>
#include <QtCore/QDateTime>
#include <QtCore/QFile>
#include <QtCore/QTimer>
#include <QtCore/QUrl>
#include <QtNetwork/QNetworkAccessManager>
#include <QtNetwork/QNetworkReply>

#include <cstdio>
#include <functional>
#include <limits>

namespace {

void say(const QString& line) {
    std::printf("%s\n", qPrintable(line));
    std::fflush(stdout);
}

// The runs of sends the gateway's workers have taken off their queue
// (im_send_stage_seconds_count{stage="queue"} of GET /metrics on the
// WebSocket URL's host and port), handed to `done`; -1 when unknown.
void sendsTaken(QNetworkAccessManager& nam, const QUrl& ws, const std::function<void(long long)>& done) {
    QUrl url(ws);
    url.setScheme(ws.scheme() == QLatin1String("wss") ? QStringLiteral("https") : QStringLiteral("http"));
    url.setPath(QStringLiteral("/metrics"));
    QNetworkReply* reply = nam.get(QNetworkRequest(url));
    QObject::connect(reply, &QNetworkReply::finished, reply, [reply, done] {
        long long n = -1;
        const QByteArray key = "im_send_stage_seconds_count{stage=\"queue\"} ";
        for (const QByteArray& line : reply->readAll().split('\n'))
            if (line.startsWith(key)) n = line.mid(key.size()).trimmed().toLongLong();
        reply->deleteLater();
        done(n);
    });
}

} // namespace

int main(int argc, char** argv) {
    QCoreApplication app(argc, argv);
    const QStringList a = app.arguments();
    if (a.size() < 5) {
        std::fprintf(stderr, "usage: %s MODE DB URL TOKEN [CONV [BODY]]\n", argv[0]);
        return 2;
    }
    const QString mode = a[1];
    im::Client client;
    QList<QUrl> servers;
    for (const QString& u : a[3].split(QLatin1Char(','), Qt::SkipEmptyParts)) servers.append(QUrl(u));
    client.setServers(servers);
    client.setCredentials(a[4]);
    client.setRequestTimeout(3000);
    client.setRetryBackoff(100, 1000);
    client.setReconnectBackoff(100, 1000);
    // The lab compares the whole local store with the server (C7): no
    // history windows, every event is synced.
    client.setBacklogLimit(0);
    if (!client.open(a[2])) {
        std::fprintf(stderr, "open failed: %s\n", qPrintable(client.lastError()));
        return 1;
    }
    QObject::connect(&client, &im::Client::errorOccurred, [](const QString& code, const QString& msg) {
        std::fprintf(stderr, "error %s: %s\n", qPrintable(code), qPrintable(msg));
    });
    QObject::connect(&client, &im::Client::messageStateChanged,
                     [](const QString& conv, const QString& cmid, qint64 seq, im::MessageState st, const QString& err) {
                         say(QStringLiteral("STATE %1 %2 %3 %4 %5")
                                 .arg(conv, cmid)
                                 .arg(seq)
                                 .arg(static_cast<int>(st))
                                 .arg(err));
                     });
    if (mode != QLatin1String("soak"))
        QTimer::singleShot(60000, &app, [] {
            std::fprintf(stderr, "child timed out\n");
            QCoreApplication::exit(3);
        });

    if (mode == QLatin1String("send") || mode == QLatin1String("send-inflight")) {
        if (a.size() < 7) return 2;
        const QString conv = a[5], body = a[6];
        const bool inflight = mode == QLatin1String("send-inflight");
        auto sent = std::make_shared<bool>(false);
        auto* nam = new QNetworkAccessManager(&app);
        const QUrl gateway = servers.value(0);
        // send-inflight: once the request is on the wire, polls /metrics until
        // the gateway took one run more than `before` (it has read the frame),
        // then prints the cmid.
        auto whenRead = [nam, gateway](const QString& cmid, long long before) {
            auto* timer = new QTimer(QCoreApplication::instance());
            auto asking = std::make_shared<bool>(false); // one GET at a time
            QObject::connect(timer, &QTimer::timeout, timer, [nam, gateway, cmid, before, timer, asking] {
                if (*asking) return;
                *asking = true;
                sendsTaken(*nam, gateway, [cmid, before, timer, asking](long long now) {
                    *asking = false;
                    if (timer->isActive() && now > before) {
                        timer->stop();
                        say(QStringLiteral("CMID ") + cmid);
                    }
                });
            });
            timer->start(20);
        };
        auto doSend = [&client, conv, body, inflight, whenRead](long long before) {
            if (inflight && before < 0) {
                std::fprintf(stderr, "the gateway's /metrics has no im_send_stage_seconds_count{stage=\"queue\"}\n");
                QCoreApplication::exit(1);
                return;
            }
            const QString cmid = client.send(conv, body);
            if (cmid.isEmpty()) {
                std::fprintf(stderr, "send failed: %s\n", qPrintable(client.lastError()));
                QCoreApplication::exit(1);
                return;
            }
            if (!inflight) {
                say(QStringLiteral("CMID ") + cmid); // right after send() returned
                return;
            }
            auto* poll = new QTimer(QCoreApplication::instance());
            QObject::connect(poll, &QTimer::timeout, poll, [&client, poll, cmid, before, whenRead] {
                for (const auto& e : client.outbox())
                    if (e.cmid() == cmid && e.attempts() >= 1 && e.isInFlight()) {
                        poll->stop();
                        whenRead(cmid, before); // on the wire: wait until the gateway has read it
                        return;
                    }
            });
            poll->start(5);
        };
        QObject::connect(&client, &im::Client::connectionStateChanged, &app, [&, sent, inflight, doSend](im::ConnectionState s) {
            if (s != im::ConnectionState::Connected || *sent) return;
            *sent = true;
            if (inflight)
                sendsTaken(*nam, gateway, doSend); // the count before the send
            else
                doSend(-1);
        });
    } else if (mode == QLatin1String("drain")) {
        auto check = [&client] {
            if (client.connectionState() == im::ConnectionState::Connected && client.pendingCount() == 0) {
                say(QStringLiteral("DRAINED"));
                QCoreApplication::exit(0);
            }
        };
        say(QStringLiteral("PENDING %1").arg(client.pendingCount()));
        QObject::connect(&client, &im::Client::outboxChanged, &app, check);
        QObject::connect(&client, &im::Client::connectionStateChanged, &app, check);
    } else if (mode == QLatin1String("watch")) {
        if (a.size() < 6) return 2;
        const QString conv = a[5];
        auto* model = new im::MessageListModel(&client, conv, &app);
        model->setWindowRows(std::numeric_limits<int>::max()); // the whole store, not a window
        QObject::connect(&client, &im::Client::conversationSynced, &app, [model, conv](const QString& c) {
            if (c == conv) {
                model->refresh();
                say(QStringLiteral("SYNCED %1").arg(model->count()));
            }
        });
        QObject::connect(&client, &im::Client::eventsApplied, &app, [model, conv](const QString& c, qint64, qint64) {
            if (c == conv) {
                model->refresh();
                say(QStringLiteral("APPLIED %1").arg(model->count()));
            }
        });
        QObject::connect(&client, &im::Client::conversationReset, &app, [conv](const QString& c) {
            if (c == conv) say(QStringLiteral("RESET"));
        });
        QObject::connect(&client, &im::Client::connectionStateChanged, &app, [&client, conv](im::ConnectionState s) {
            if (s == im::ConnectionState::Connected) client.sync(conv);
        });
    } else if (mode == QLatin1String("soak")) {
        if (a.size() < 7) return 2;
        const QString conv = a[5];
        const int count = a[6].toInt();
        // A tag per incarnation: a restarted child's bodies stay unique (the
        // soak counts events by body).
        const QString tag = a.size() > 7 ? a[7] : QString();
        auto* pace = new QTimer(&app);
        auto sent = std::make_shared<int>(0);
        const QString endFlag = a[2] + QStringLiteral(".end");
        QObject::connect(pace, &QTimer::timeout, &app, [&client, pace, sent, count, conv, endFlag, tag] {
            if (*sent >= count || QFile::exists(endFlag)) {
                pace->stop();
                return;
            }
            const QString body = QStringLiteral("sdk-%1-%2%3").arg(client.userId(), tag).arg(*sent);
            say(QStringLiteral("ASK ") + body); // asked for: may land even if killed before the CMID line
            const QString cmid = client.send(conv, body);
            ++*sent; // a refused send() is not retried under the same body
            if (cmid.isEmpty()) {
                std::fprintf(stderr, "send failed: %s\n", qPrintable(client.lastError()));
                return;
            }
            say(QStringLiteral("CMID ") + cmid + QLatin1Char(' ') + body);
        });
        QObject::connect(&client, &im::Client::connectionStateChanged, &app, [pace](im::ConnectionState s) {
            if (s == im::ConnectionState::Connected && !pace->isActive()) pace->start(100);
        });
        // The soak is over when the lab creates the file DB.end: finish
        // sending, drain the outbox, sync once more, print the rows.
        // Two steps: drained (say DRAINED), then, once every client drained
        // (the lab creates DB.sync), one last sync and the rows.
        auto* finish = new QTimer(&app);
        auto drained = std::make_shared<bool>(false);
        const QString syncFlag = a[2] + QStringLiteral(".sync");
        QObject::connect(finish, &QTimer::timeout, &app, [&client, conv, finish, endFlag, syncFlag, drained] {
            if (!QFile::exists(endFlag) || client.pendingCount() > 0 ||
                client.connectionState() != im::ConnectionState::Connected)
                return;
            if (!*drained) {
                *drained = true;
                say(QStringLiteral("DRAINED"));
            }
            if (!QFile::exists(syncFlag)) return;
            finish->stop();
            // The timeline as an app shows it, read once at the end (a live
            // model would re-read the growing conversation on every push).
            auto* model = new im::MessageListModel(&client, conv, &client);
            model->setWindowRows(std::numeric_limits<int>::max()); // the whole store, not a window
            QObject::connect(&client, &im::Client::conversationSynced, model, [model, conv](const QString& c) {
                if (c != conv) return;
                model->refresh();
                // Oldest first, as the server's rows (the model is newest first).
                for (int r = model->count() - 1; r >= 0; --r) {
                    const qint64 seq = model->get(r, im::MessageListModel::SeqRole).toLongLong();
                    say(QStringLiteral("ROW %1 %2 %3")
                            .arg(seq)
                            .arg(model->get(r, im::MessageListModel::KindRole).toString(),
                                 model->get(r, im::MessageListModel::BodyRole).toString()));
                    if (model->get(r, im::MessageListModel::StateRole).toInt() ==
                        static_cast<int>(im::MessageState::Recalled))
                        say(QStringLiteral("RECALLED %1").arg(seq));
                }
                say(QStringLiteral("DONE"));
                QCoreApplication::exit(0);
            });
            client.sync(conv);
        });
        finish->start(100);
        // Once the soak is over, what the client waits on (to stderr, for the
        // lab's report if it does not converge).
        auto* status = new QTimer(&app);
        QObject::connect(status, &QTimer::timeout, &app, [&client, endFlag] {
            if (!QFile::exists(endFlag)) return;
            QString head;
            const QList<im::OutboxEntry> entries = client.outbox();
            for (int i = 0; i < std::min<int>(2, int(entries.size())); ++i)
                head += QStringLiteral(" [%1 attempts=%2 inFlight=%3 last=%4 retryIn=%5ms]")
                            .arg(entries[i].cmid().left(8))
                            .arg(entries[i].attempts())
                            .arg(entries[i].isInFlight())
                            .arg(entries[i].lastError())
                            .arg(entries[i].nextRetryAt().isValid()
                                     ? QDateTime::currentDateTimeUtc().msecsTo(entries[i].nextRetryAt())
                                     : -1);
            std::fprintf(stderr, "status: state=%d pending=%d%s\n", static_cast<int>(client.connectionState()),
                         client.pendingCount(), qPrintable(head));
        });
        status->start(5000);
    } else {
        std::fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    client.connectToServer();
    return app.exec();
}
