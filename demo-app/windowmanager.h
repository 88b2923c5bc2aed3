// Opens chat windows (each with its own im::Client and SQLite file) and the
// sign-in dialog for "open another window".
#pragma once

#include "signindialog.h"
#include "tokenfile.h"

#include <QtCore/QObject>
#include <QtCore/QPointer>
#include <QtCore/QUrl>

class ChatWindow;

struct AppOptions {
    QList<QUrl> servers; ///< --server (repeatable); else the token file's server
    TokenFile tokens;    ///< --token-file (may be empty)
    QString dataDir;     ///< where per-user databases go (--data-dir; default the app data dir)
    QString caFile;      ///< --ca-file: wss:// CA trusted instead of the system store
    QString pinSha256;   ///< --pin-sha256: wss:// server certificate pin
};

class WindowManager : public QObject {
    Q_OBJECT
public:
    explicit WindowManager(AppOptions options, QObject *parent = nullptr);
    ~WindowManager() override;

    const AppOptions &options() const { return options_; }
    /// Fills in the defaults (servers, database path), opens and shows a window.
    ChatWindow *openWindow(Session session);
    /// Shows the sign-in dialog (non-blocking); accepting it opens a window.
    SignInDialog *showSignIn(QWidget *parent, const QString &preferUser = {});
    /// Closes `window` (its client closes the store, as a quit app) and
    /// opens a new window for the same session and store, at the next
    /// event loop turn (the window may be the one asking); windowOpened()
    /// gives the new one.
    void restartWindow(ChatWindow *window);
    QList<ChatWindow *> windows() const;
    /// dataDir/<label>.db, with -2, -3, ... while that file is in use by a window.
    QString defaultDatabasePath(const Session &session) const;

Q_SIGNALS:
    void windowOpened(ChatWindow *window);

private:
    AppOptions options_;
    QList<QPointer<ChatWindow>> windows_;
};
