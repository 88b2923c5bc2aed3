// Child process for the kill tests: drives an im::Client on a database and
// prints what it did on stdout, line by line, so the parent test can SIGKILL
// it at a chosen point.
//
//   killhelper send   --db F --url U --token T --conv C --body B
//       connects, sends one message, prints "CMID <cmid>", then keeps running
//       (prints "SENT" when the reply was processed).
//   killhelper changes --db F --url U --token T --conv C --body B
//       connects, sends one message, then edits it and reacts to it by its
//       cmid (contract section 12), prints "CMIDS <send> <edit> <react>",
//       then keeps running.
//   killhelper sendfile --db F --url U --token T --conv C --file P [--chunk N] [--resume]
//       connects; if the outbox is empty, calls sendFile(C, P) once and prints
//       "CMID <cmid>" (with --resume: prints "EMPTY" and exits 0 instead);
//       else it resumes what the outbox holds and prints "RESUME <cmid>"; then "PROGRESS <sent> <total>" per uploadProgress and
//       "SENT <seq>" once the message is Sent, then exits 0 (obligation 17).
//   killhelper resend --db F --url U --token T
//       connects and prints "DONE" once the outbox is empty, then exits 0.
//   killhelper hold   --db F
//       opens the database, prints "OPEN" and stays (holding the store's lock)
//       until killed; "OPEN FAILED <reason>" and exit 2 if open() fails.
//   killhelper sync   --db F --url U --token T --conv C [--page N]
//       prints "PAGE <conv> <toSeq>" per applied page and "SYNCED <conv>"
//       when the conversation reached head, then exits 0.
#include <im/client.h>

#include <QtCore/QCommandLineParser>
#include <QtCore/QCoreApplication>
#include <QtCore/QFileInfo>
#include <QtCore/QTimer>

#include <cstdio>

static void say(const QString &line) {
    std::fputs(qPrintable(line + QLatin1Char('\n')), stdout);
    std::fflush(stdout);
}

int main(int argc, char **argv) {
    QCoreApplication app(argc, argv);
    QCommandLineParser p;
    p.addPositionalArgument(QStringLiteral("mode"), QStringLiteral("send | resend | sync"));
    p.addOption({QStringLiteral("db"), QStringLiteral("database"), QStringLiteral("file")});
    p.addOption({QStringLiteral("url"), QStringLiteral("server url"), QStringLiteral("url")});
    p.addOption({QStringLiteral("token"), QStringLiteral("device token"), QStringLiteral("token")});
    p.addOption({QStringLiteral("conv"), QStringLiteral("conversation"), QStringLiteral("conv")});
    p.addOption({QStringLiteral("body"), QStringLiteral("message body"), QStringLiteral("body")});
    p.addOption({QStringLiteral("page"), QStringLiteral("sync page size"), QStringLiteral("n"), QStringLiteral("50")});
    p.addOption({QStringLiteral("timeout"), QStringLiteral("request timeout (ms)"), QStringLiteral("ms"), QStringLiteral("2000")});
    p.addOption({QStringLiteral("file"), QStringLiteral("file to send"), QStringLiteral("path")});
    p.addOption({QStringLiteral("resume"), QStringLiteral("sendfile: never call sendFile()")});
    p.addOption({QStringLiteral("chunk"), QStringLiteral("upload chunk (bytes)"), QStringLiteral("n"), QStringLiteral("1048576")});
    p.process(app);
    const QString mode = p.positionalArguments().value(0);

    im::Client client;
    client.setServers({QUrl(p.value(QStringLiteral("url")))});
    client.setCredentials(p.value(QStringLiteral("token")));
    client.setRequestTimeout(p.value(QStringLiteral("timeout")).toInt());
    client.setReconnectBackoff(100, 1000);
    client.setSyncPageSize(p.value(QStringLiteral("page")).toInt());
    QObject::connect(&client, &im::Client::errorOccurred, [](const QString &code, const QString &msg) {
        say(QStringLiteral("ERROR %1 %2").arg(code, msg));
    });
    if (!client.open(p.value(QStringLiteral("db")))) {
        say(QStringLiteral("OPEN FAILED ") + client.lastError());
        return 2;
    }
    QTimer::singleShot(60000, &app, [] {
        say(QStringLiteral("TIMEOUT"));
        QCoreApplication::exit(3);
    });

    if (mode == u"send") {
        const QString conv = p.value(QStringLiteral("conv"));
        const QString body = p.value(QStringLiteral("body"));
        QObject::connect(&client, &im::Client::connectionStateChanged, &client,
                         [&client, conv, body](im::ConnectionState s) {
                             static bool sent = false;
                             if (s != im::ConnectionState::Connected || sent)
                                 return;
                             sent = true;
                             // Let the post-hello traffic (sub, convs, sync) settle first.
                             QTimer::singleShot(300, &client, [&client, conv, body] {
                                 const QString cmid = client.send(conv, body);
                                 say(QStringLiteral("CMID ") + cmid);
                             });
                         });
        QObject::connect(&client, &im::Client::messageStateChanged, &client,
                         [](const QString &, const QString &, qint64 seq, im::MessageState st, const QString &) {
                             if (st == im::MessageState::Sent)
                                 say(QStringLiteral("SENT %1").arg(seq));
                         });
    } else if (mode == u"sendfile") {
        const QString conv = p.value(QStringLiteral("conv"));
        const QString file = p.value(QStringLiteral("file"));
        client.setUploadChunkSize(p.value(QStringLiteral("chunk")).toInt());
        static QString cmid;
        const QList<im::OutboxEntry> pending = client.outbox();
        if (!pending.isEmpty()) {
            cmid = pending.first().cmid();
            say(QStringLiteral("RESUME ") + cmid);
        } else if (p.isSet(QStringLiteral("resume"))) {
            say(QStringLiteral("EMPTY"));
            return 0;
        } else {
            // Committed before it returns: a kill from here on resumes it.
            cmid = client.sendFile(conv, file, QStringLiteral("file ") + QFileInfo(file).fileName());
            say(QStringLiteral("CMID ") + cmid);
            if (cmid.isEmpty())
                return 2;
        }
        QObject::connect(&client, &im::Client::uploadProgress, &client, [](const QString &c, qint64 sent, qint64 total) {
            if (c == cmid)
                say(QStringLiteral("PROGRESS %1 %2").arg(sent).arg(total));
        });
        QObject::connect(&client, &im::Client::messageStateChanged, &client,
                         [](const QString &, const QString &c, qint64 seq, im::MessageState st, const QString &code) {
                             if (c != cmid)
                                 return;
                             if (st == im::MessageState::Sent) {
                                 say(QStringLiteral("SENT %1").arg(seq));
                                 QCoreApplication::exit(0);
                             } else if (st == im::MessageState::Failed) {
                                 say(QStringLiteral("FAILED ") + code);
                                 QCoreApplication::exit(4);
                             }
                         });
    } else if (mode == u"changes") {
        const QString conv = p.value(QStringLiteral("conv"));
        const QString body = p.value(QStringLiteral("body"));
        QObject::connect(&client, &im::Client::connectionStateChanged, &client,
                         [&client, conv, body](im::ConnectionState s) {
                             static bool sent = false;
                             if (s != im::ConnectionState::Connected || sent)
                                 return;
                             sent = true;
                             QTimer::singleShot(300, &client, [&client, conv, body] {
                                 const QString target = client.send(conv, body);
                                 const QString edit = client.edit(conv, target, body + QStringLiteral(" (edited)"));
                                 const QString react = client.react(conv, target, QStringLiteral("\U0001F44D"), true);
                                 say(QStringLiteral("CMIDS %1 %2 %3").arg(target, edit, react));
                             });
                         });
    } else if (mode == u"resend") {
        QObject::connect(&client, &im::Client::outboxChanged, &client, [&client] {
            if (client.pendingCount() == 0 && client.connectionState() == im::ConnectionState::Connected) {
                say(QStringLiteral("DONE"));
                QCoreApplication::exit(0);
            }
        });
        QObject::connect(&client, &im::Client::connectionStateChanged, &client, [&client](im::ConnectionState s) {
            if (s == im::ConnectionState::Connected && client.pendingCount() == 0) {
                say(QStringLiteral("DONE"));
                QCoreApplication::exit(0);
            }
        });
    } else if (mode == u"sync") {
        const QString conv = p.value(QStringLiteral("conv"));
        QObject::connect(&client, &im::Client::eventsApplied, &client, [conv](const QString &c, qint64, qint64 to) {
            if (c == conv)
                say(QStringLiteral("PAGE %1 %2").arg(c).arg(to));
        });
        QObject::connect(&client, &im::Client::conversationSynced, &client, [conv](const QString &c) {
            if (c == conv) {
                say(QStringLiteral("SYNCED ") + c);
                QCoreApplication::exit(0);
            }
        });
    } else if (mode == u"hold") {
        say(QStringLiteral("OPEN"));
        return app.exec();
    } else {
        say(QStringLiteral("unknown mode ") + mode);
        return 2;
    }
    client.connectToServer();
    return app.exec();
}
