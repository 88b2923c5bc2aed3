// Small helpers shared by the SDK tests.
#pragma once

#include <QtCore/QProcess>
#include <QtCore/QString>
#include <QtCore/QVariant>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlQuery>
#include <QtTest/QTest>

#include <atomic>
#include <optional>

// Runs one scalar query on a SQLite file through a separate connection (what
// another process would see), returning an invalid QVariant on error.
inline QVariant sqlScalar(const QString &dbPath, const QString &sql, const QVariantList &binds = {}) {
    static std::atomic<int> counter{0};
    const QString name = QStringLiteral("probe-%1").arg(counter.fetch_add(1));
    QVariant out;
    {
        QSqlDatabase db = QSqlDatabase::addDatabase(QStringLiteral("QSQLITE"), name);
        db.setDatabaseName(dbPath);
        db.setConnectOptions(QStringLiteral("QSQLITE_BUSY_TIMEOUT=5000"));
        if (db.open()) {
            QSqlQuery q(db);
            q.prepare(sql);
            for (const QVariant &b : binds)
                q.addBindValue(b);
            if (q.exec() && q.next())
                out = q.value(0);
        }
        db.close();
    }
    QSqlDatabase::removeDatabase(name);
    return out;
}

// True once the child process has exited (waiting up to a minute).
inline bool finished(QProcess &proc) {
    return proc.state() == QProcess::NotRunning || proc.waitForFinished(60000);
}

// Waits (spinning the event loop, so an in-process fake server keeps running)
// for a stdout line of the child starting with `prefix`; returns the rest of
// it (possibly empty), or nothing if the child exited or the time ran out
// first. Callers must tell the two apart: a line that is only the prefix
// ("DONE") is an empty string, not a timeout.
inline std::optional<QString> waitForLine(QProcess &proc, const QString &prefix, int timeoutMs = 60000) {
    std::optional<QString> found;
    QByteArray buffer;
    const bool ended = QTest::qWaitFor([&] {
        buffer += proc.readAllStandardOutput();
        for (const QByteArray &raw : buffer.split('\n')) {
            const QString line = QString::fromUtf8(raw).trimmed();
            if (line.startsWith(prefix)) {
                found = line.mid(prefix.size()).trimmed();
                return true;
            }
        }
        return proc.state() == QProcess::NotRunning;
    }, timeoutMs);
    return ended ? found : std::nullopt;
}

// The rest of the line, or "<no line>" when none came (for QCOMPARE).
inline QString lineOrNone(const std::optional<QString> &line) {
    return line.value_or(QStringLiteral("<no line>"));
}
