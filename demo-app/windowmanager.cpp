#include "windowmanager.h"

#include "chatwindow.h"

#include <im/client.h>

#include <QtCore/QDir>
#include <QtCore/QFileInfo>
#include <QtCore/QRegularExpression>

WindowManager::WindowManager(AppOptions options, QObject *parent) : QObject(parent), options_(std::move(options)) {}

WindowManager::~WindowManager() {
    for (const QPointer<ChatWindow> &w : std::as_const(windows_))
        delete w.data();
}

QList<ChatWindow *> WindowManager::windows() const {
    QList<ChatWindow *> out;
    for (const QPointer<ChatWindow> &w : windows_)
        if (w)
            out << w.data();
    return out;
}

QString WindowManager::defaultDatabasePath(const Session &session) const {
    QStringList inUse;
    for (ChatWindow *w : windows())
        inUse << QFileInfo(w->client()->databasePath()).absoluteFilePath();
    const QDir dir(options_.dataDir);
    QString label = session.label();
    label.replace(QRegularExpression(QStringLiteral("[^A-Za-z0-9._-]")), QStringLiteral("_"));
    for (int n = 1;; ++n) {
        const QString name = n == 1 ? label + QStringLiteral(".db") : QStringLiteral("%1-%2.db").arg(label).arg(n);
        const QString path = QFileInfo(dir.filePath(name)).absoluteFilePath();
        if (!inUse.contains(path))
            return path;
    }
}

ChatWindow *WindowManager::openWindow(Session session) {
    if (session.servers.isEmpty())
        session.servers = options_.servers;
    if (session.servers.isEmpty() && !options_.tokens.server.isEmpty())
        session.servers = {QUrl(options_.tokens.server)};
    if (session.caFile.isEmpty() && session.pinSha256.isEmpty()) {
        session.caFile = options_.caFile;
        session.pinSha256 = options_.pinSha256;
    }
    if (session.dbPath.isEmpty()) {
        QDir().mkpath(options_.dataDir);
        session.dbPath = defaultDatabasePath(session);
    }
    auto *w = new ChatWindow(session);
    windows_ << w;
    connect(w, &ChatWindow::openAnotherRequested, this, [this, w] { showSignIn(w); });
    connect(w, &ChatWindow::restartRequested, this, [this, w] { restartWindow(w); });
    w->show();
    emit windowOpened(w);
    return w;
}

void WindowManager::restartWindow(ChatWindow *window) {
    QPointer<ChatWindow> w(window);
    QMetaObject::invokeMethod(
        this,
        [this, w] {
            if (!w)
                return;
            const Session session = w->session(); // dbPath set by openWindow()
            const QRect geometry = w->geometry();
            windows_.removeAll(w);
            delete w.data(); // the store is closed before the new client opens it
            ChatWindow *again = openWindow(session);
            again->setGeometry(geometry);
        },
        Qt::QueuedConnection);
}

SignInDialog *WindowManager::showSignIn(QWidget *parent, const QString &preferUser) {
    QStringList openDevices;
    QList<QUrl> servers = options_.servers;
    QString caFile = options_.caFile;
    QString pin = options_.pinSha256;
    for (ChatWindow *w : windows()) {
        openDevices << (w->client()->deviceId().isEmpty() ? w->session().device : w->client()->deviceId());
    }
    if (auto *cw = qobject_cast<ChatWindow *>(parent)) {
        servers = cw->client()->servers();
        caFile = cw->session().caFile;
        pin = cw->session().pinSha256;
    }
    auto *dialog = new SignInDialog(options_.tokens, servers, openDevices, preferUser, parent);
    dialog->setTlsSettings(caFile, pin);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &QDialog::accepted, this, [this, dialog] { openWindow(dialog->session()); });
    dialog->open();
    return dialog;
}
