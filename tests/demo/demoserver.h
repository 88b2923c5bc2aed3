// Runs the real imserver for the GUI test, the way the SDK integration tests
// do: `imserver admin --state-dir DIR demo --out FILE` provisions the demo
// users and conversations into an embedded PostgreSQL, then `imserver
// --state-dir DIR --listen 127.0.0.1:0 --ready-file FILE --enable-faults`
// serves them on a free port until destroyed (SIGTERM).
#pragma once

#include <QtCore/QFile>
#include <QtCore/QProcess>
#include <QtCore/QTemporaryDir>
#include <QtCore/QUrl>
#include <QtTest/QtTest>

class DemoServer {
public:
    explicit DemoServer(QString binary) : bin_(std::move(binary)) {}
    ~DemoServer() { stop(); }

    /// Empty on success, else what went wrong.
    QString start() {
        if (!dir_.isValid())
            return QStringLiteral("no temporary directory");
        // The embedded PostgreSQL may run as the postgres user: let it in.
        QFile::setPermissions(dir_.path(), QFileDevice::Permissions(0x7777));
        const QString state = dir_.filePath(QStringLiteral("state"));
        tokenFile = dir_.filePath(QStringLiteral("demo-tokens.json"));
        QProcess admin;
        admin.setProcessChannelMode(QProcess::MergedChannels);
        admin.start(bin_, {QStringLiteral("admin"), QStringLiteral("--state-dir"), state, QStringLiteral("demo"),
                           QStringLiteral("--out"), tokenFile});
        if (!admin.waitForFinished(240000) || admin.exitStatus() != QProcess::NormalExit || admin.exitCode() != 0)
            return QStringLiteral("imserver admin demo failed (exit %1): %2")
                .arg(admin.exitCode())
                .arg(QString::fromUtf8(admin.readAll()).right(2000));
        const QString ready = dir_.filePath(QStringLiteral("ready"));
        proc_.setProcessChannelMode(QProcess::MergedChannels);
        proc_.start(bin_, {QStringLiteral("--state-dir"), state, QStringLiteral("--listen"),
                           QStringLiteral("127.0.0.1:0"), QStringLiteral("--ready-file"), ready,
                           QStringLiteral("--enable-faults")});
        if (!proc_.waitForStarted())
            return QStringLiteral("imserver did not start");
        int port = 0;
        const bool up = QTest::qWaitFor(
            [&] {
                QFile r(ready);
                if (r.open(QIODevice::ReadOnly)) {
                    const QByteArray text = r.readAll();
                    if (text.endsWith('\n'))
                        port = text.trimmed().toInt();
                }
                return port > 0 || proc_.state() == QProcess::NotRunning;
            },
            180000);
        if (!up || port <= 0)
            return QStringLiteral("imserver never became ready: %1").arg(QString::fromUtf8(proc_.readAll()).right(2000));
        url = QUrl(QStringLiteral("ws://127.0.0.1:%1/v1/ws").arg(port));
        return {};
    }

    void stop() {
        if (proc_.state() == QProcess::NotRunning)
            return;
        proc_.terminate();
        if (!proc_.waitForFinished(60000)) {
            proc_.kill();
            proc_.waitForFinished();
        }
    }

    QUrl url;
    QString tokenFile;

private:
    QString bin_;
    QTemporaryDir dir_;
    QProcess proc_;
};
