// Small helpers shared by the SDK tests.
#pragma once

#include <QtCore/QString>
#include <QtCore/QVariant>
#include <QtSql/QSqlDatabase>
#include <QtSql/QSqlQuery>

#include <atomic>

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
