#include "tokenfile.h"

#include <QtCore/QFile>
#include <QtCore/QJsonArray>
#include <QtCore/QJsonDocument>
#include <QtCore/QJsonObject>

bool TokenFile::load(const QString &file, QString *error) {
    QFile f(file);
    if (!f.open(QIODevice::ReadOnly)) {
        *error = QStringLiteral("cannot read token file %1: %2").arg(file, f.errorString());
        return false;
    }
    QJsonParseError perr;
    const QJsonDocument doc = QJsonDocument::fromJson(f.readAll(), &perr);
    if (!doc.isObject()) {
        *error = QStringLiteral("token file %1 is not a JSON object: %2").arg(file, perr.errorString());
        return false;
    }
    const QJsonObject o = doc.object();
    TokenFile t;
    t.path = file;
    t.server = o.value(QStringLiteral("server")).toString();
    for (const QJsonValue &v : o.value(QStringLiteral("users")).toArray()) {
        const QJsonObject u = v.toObject();
        DemoUser d{u.value(QStringLiteral("user")).toString(), u.value(QStringLiteral("device")).toString(),
                   u.value(QStringLiteral("token")).toString()};
        if (!d.user.isEmpty() && !d.token.isEmpty())
            t.users << d;
    }
    for (const QJsonValue &v : o.value(QStringLiteral("conversations")).toArray())
        t.conversations << v.toString();
    if (t.users.isEmpty()) {
        *error = QStringLiteral("token file %1 lists no users").arg(file);
        return false;
    }
    *this = t;
    return true;
}

const DemoUser *TokenFile::find(const QString &user) const {
    for (const DemoUser &u : users)
        if (u.user == user)
            return &u;
    for (const DemoUser &u : users)
        if (u.device == user)
            return &u;
    return nullptr;
}
