// The JSON file `imserver admin demo` writes: demo users, their device
// tokens, the server URL and the demo conversations.
#pragma once

#include <QtCore/QList>
#include <QtCore/QString>
#include <QtCore/QStringList>

struct DemoUser {
    QString user;
    QString device;
    QString token;
};

struct TokenFile {
    QString path;
    QString server;              ///< "server" field (may be empty)
    QList<DemoUser> users;
    QStringList conversations;

    /// Reads `path`; on failure returns false and sets *error.
    bool load(const QString &path, QString *error);
    /// The entry of `user` (matched on user, then on device), or nullptr.
    const DemoUser *find(const QString &user) const;
};
