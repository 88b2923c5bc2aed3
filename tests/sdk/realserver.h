// Test harness for the real server, shared by the SDK and demo-app tests:
// provisions the demo data set into an embedded PostgreSQL (imserver admin
// ... demo) and runs imserver on a free port until destroyed (SIGTERM).
#pragma once

#include <QtCore/QDir>
#include <QtCore/QFile>
#include <QtCore/QFileInfo>
#include <QtCore/QHash>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>
#include <QtCore/QProcess>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUrl>
#include <QtTest/QtTest>

#include <cstdio>
#include <cstdlib>

class RealServer {
public:
    explicit RealServer(QString binary) : bin_(std::move(binary)) {}
    ~RealServer() { stop(); }

    // Returns an empty string on success, else what went wrong.
    QString start() {
        if (!dir_.isValid())
            return QStringLiteral("no temporary directory");
        // The embedded PostgreSQL runs as the postgres user: let it in.
        QFile::setPermissions(dir_.path(), QFileDevice::ReadOwner | QFileDevice::WriteOwner | QFileDevice::ExeOwner
                                               | QFileDevice::ReadOther | QFileDevice::WriteOther
                                               | QFileDevice::ExeOther | QFileDevice::ReadGroup
                                               | QFileDevice::WriteGroup | QFileDevice::ExeGroup);
        const QString state = dir_.filePath(QStringLiteral("state"));
        tokenFile = dir_.filePath(QStringLiteral("demo.json"));
        const QString &demo = tokenFile;
        QProcess admin;
        admin.setProcessChannelMode(QProcess::MergedChannels);
        admin.start(bin_, {QStringLiteral("admin"), QStringLiteral("--state-dir"), state, QStringLiteral("demo"),
                           QStringLiteral("--out"), demo});
        if (!admin.waitForFinished(240000) || admin.exitStatus() != QProcess::NormalExit || admin.exitCode() != 0)
            return QStringLiteral("imserver admin demo failed (exit %1): %2")
                .arg(admin.exitCode())
                .arg(QString::fromUtf8(admin.readAll()).right(2000));
        QFile f(demo);
        if (!f.open(QIODevice::ReadOnly))
            return QStringLiteral("demo output %1 missing").arg(demo);
        const QJsonObject o = QJsonDocument::fromJson(f.readAll()).object();
        for (const QJsonValue &u : o.value(QStringLiteral("users")).toArray())
            tokens.insert(u.toObject().value(QStringLiteral("user")).toString(),
                          u.toObject().value(QStringLiteral("token")).toString());
        if (tokens.isEmpty())
            return QStringLiteral("demo output has no users");
        return launch();
    }

    // Stops imserver (SIGTERM) and starts it again on the same state (its
    // database kept; what it holds in memory gone, as after an operator's
    // restart). The port changes: `url` is the new one. Empty on success.
    QString restart() {
        stop();
        return launch();
    }

private:
    // Writes unlimited unless a test asks for --send-rate (tests/support's
    // harness does the same): the suites send bursts from one user.
    QStringList unlimitedUnlessAsked() const {
        if (serverArgs.contains(QStringLiteral("--send-rate")))
            return {};
        return {QStringLiteral("--send-rate"), QStringLiteral("0")};
    }

    QString launch() {
        const QString state = dir_.filePath(QStringLiteral("state"));
        const QString ready = dir_.filePath(QStringLiteral("ready"));
        QFile::remove(ready);
        proc_.setProcessChannelMode(QProcess::MergedChannels);
        proc_.start(bin_, QStringList{QStringLiteral("--state-dir"), state, QStringLiteral("--listen"),
                                      QStringLiteral("127.0.0.1:0"), QStringLiteral("--ready-file"), ready}
                              + unlimitedUnlessAsked() + serverArgs);
        if (!proc_.waitForStarted())
            return QStringLiteral("imserver did not start");
        judged_ = false; // a started process is judged by the next stop()
        int port = 0;
        const bool up = QTest::qWaitFor([&] {
            QFile r(ready);
            if (r.open(QIODevice::ReadOnly)) {
                const QByteArray text = r.readAll();
                if (text.endsWith('\n'))
                    port = text.trimmed().toInt();
            }
            return port > 0 || proc_.state() == QProcess::NotRunning;
        }, 180000);
        if (!up || port <= 0)
            return QStringLiteral("imserver never became ready: %1")
                .arg(QString::fromUtf8(proc_.readAll()).right(2000));
        url = QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(port));
        return {};
    }

public:

    void stop() {
        if (judged_)
            return;
        judged_ = true;
        // An imserver that is no longer running was not stopped by this
        // harness (tests only pause it, never end it): it died by itself,
        // which is unclean, and its output is scanned all the same.
        const bool wasRunning = proc_.state() != QProcess::NotRunning;
        bool clean = wasRunning;
        if (wasRunning) {
            proc_.terminate(); // SIGTERM: goaway, drain, stop PostgreSQL
            clean = proc_.waitForFinished(60000);
            if (!clean) {
                proc_.kill();
                proc_.waitForFinished();
            }
        }
#ifdef IM_SANITIZED
        // A sanitizer build: a report in imserver's output, or an exit that is
        // not a clean 0 after SIGTERM (LeakSanitizer exits non-zero), fails
        // the test binary at exit.
        const QByteArray out = proc_.readAll();
        clean = clean && proc_.exitStatus() == QProcess::NormalExit && proc_.exitCode() == 0;
        for (const char *mark : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "WARNING: ThreadSanitizer",
                                 "runtime error:"})
            clean = clean && !out.contains(mark);
        if (!clean) {
            std::fprintf(stderr, "---- imserver (%s, exit %d) reported a sanitizer error or did not stop cleanly:\n%s\n"
                                 "---- end of imserver output\n",
                         wasRunning ? "stopped by SIGTERM" : "had already exited by itself", proc_.exitCode(),
                         out.constData());
            static const bool registered = (std::atexit([] {
                std::fprintf(stderr, "==== a child imserver failed its sanitizer check: failing the test\n");
                std::fflush(nullptr);
                std::_Exit(1);
            }), true);
            (void)registered;
        }
#else
        (void)clean;
#endif
    }

    QString output() { return QString::fromUtf8(proc_.readAll()); }
    // libpq URL of the embedded database (its private socket folder), for
    // test seeding while the server runs.
    QString dbUrl() const {
        const QString pg = QFileInfo(dir_.filePath(QStringLiteral("state/pg"))).canonicalFilePath();
        return QStringLiteral("host=%1/run port=5432 user=im dbname=im").arg(pg);
    }
    qint64 pid() const { return proc_.processId(); }
    // Runs im_sdk_seed (tests/sdk/seed.cpp, at `seedBin`) against this
    // server's database; empty on success, else what went wrong.
    QString seed(const QString &seedBin, const QStringList &args) const {
        QProcess p;
        p.setProcessChannelMode(QProcess::MergedChannels);
        p.start(seedBin, QStringList{dbUrl()} + args);
        if (!p.waitForFinished(300000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0)
            return QStringLiteral("seed failed: ") + QString::fromUtf8(p.readAll());
        return {};
    }

    QStringList serverArgs;         // extra imserver flags, set before start()
    QUrl url;
    QString tokenFile;              // what `imserver admin demo` wrote
    QHash<QString, QString> tokens; // user -> device token

private:
    QString bin_;
    QTemporaryDir dir_;
    QProcess proc_;
    bool judged_ = true; // stop() judges a started process once
};
