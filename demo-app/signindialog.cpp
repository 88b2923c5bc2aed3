#include "signindialog.h"

#include <QtCore/QCryptographicHash>
#include <QtCore/QFileInfo>
#include <QtCore/QRegularExpression>
#include <QtWidgets/QDialogButtonBox>
#include <QtWidgets/QFileDialog>
#include <QtWidgets/QFormLayout>
#include <QtWidgets/QHBoxLayout>
#include <QtWidgets/QLabel>
#include <QtWidgets/QLineEdit>
#include <QtWidgets/QListWidget>
#include <QtWidgets/QMessageBox>
#include <QtWidgets/QPlainTextEdit>
#include <QtWidgets/QPushButton>

QString Session::label() const {
    if (!device.isEmpty() && !user.isEmpty() && device != user + QLatin1String("-d1"))
        return device;
    if (!user.isEmpty())
        return user;
    const QByteArray h = QCryptographicHash::hash(token.toUtf8(), QCryptographicHash::Sha256).toHex().left(8);
    return QStringLiteral("token-%1").arg(QString::fromLatin1(h));
}

QString checkTlsSettings(const QString &caFile, const QString &pinSha256) {
    if (!caFile.isEmpty() && !QFileInfo(caFile).isReadable())
        return QObject::tr("CA file %1 cannot be read.").arg(caFile);
    QString hex = pinSha256;
    hex.remove(QLatin1Char(':'));
    static const QRegularExpression sha256(QStringLiteral("^[0-9A-Fa-f]{64}$"));
    if (!pinSha256.isEmpty() && !sha256.match(hex).hasMatch())
        return QObject::tr("The pin is not a SHA-256 fingerprint (64 hex digits, colons allowed): %1").arg(pinSha256);
    return {};
}

QList<QUrl> parseServerList(const QString &text, QString *bad) {
    QList<QUrl> out;
    for (const QString &raw : text.split(QRegularExpression(QStringLiteral("[\\s,]+")), Qt::SkipEmptyParts)) {
        const QUrl u(raw.trimmed());
        if (!u.isValid() || u.host().isEmpty()
            || (u.scheme() != QLatin1String("ws") && u.scheme() != QLatin1String("wss"))) {
            if (bad)
                *bad = raw;
            return {};
        }
        out << u;
    }
    return out;
}

SignInDialog::SignInDialog(const TokenFile &tokens, const QList<QUrl> &servers, const QStringList &openDevices,
                           const QString &preferUser, QWidget *parent)
    : QDialog(parent), tokens_(tokens), openDevices_(openDevices) {
    setObjectName(QStringLiteral("signInDialog"));
    setWindowTitle(tr("imdemo: sign in"));
    auto *form = new QFormLayout;

    auto *fileRow = new QHBoxLayout;
    tokenFileEdit_ = new QLineEdit(tokens.path);
    tokenFileEdit_->setObjectName(QStringLiteral("tokenFileEdit"));
    tokenFileEdit_->setPlaceholderText(tr("var/demo-tokens.json (written by imserver admin demo)"));
    auto *browse = new QPushButton(tr("Load..."));
    fileRow->addWidget(tokenFileEdit_, 1);
    fileRow->addWidget(browse);
    form->addRow(tr("Token file:"), fileRow);
    connect(browse, &QPushButton::clicked, this, [this] {
        const QString f = QFileDialog::getOpenFileName(this, tr("Token file"), tokenFileEdit_->text(),
                                                       tr("JSON (*.json);;All files (*)"));
        if (!f.isEmpty())
            loadTokenFile(f);
    });
    connect(tokenFileEdit_, &QLineEdit::editingFinished, this, [this] {
        if (tokenFileEdit_->text() != tokens_.path)
            loadTokenFile(tokenFileEdit_->text());
    });

    userList_ = new QListWidget;
    userList_->setObjectName(QStringLiteral("userList"));
    userList_->setMinimumHeight(90);
    form->addRow(tr("Demo user:"), userList_);

    tokenEdit_ = new QLineEdit;
    tokenEdit_->setObjectName(QStringLiteral("tokenEdit"));
    tokenEdit_->setPlaceholderText(tr("or paste a device token (imserver admin ... device add)"));
    form->addRow(tr("Token:"), tokenEdit_);

    serversEdit_ = new QPlainTextEdit;
    serversEdit_->setObjectName(QStringLiteral("serversEdit"));
    serversEdit_->setPlaceholderText(tr("ws://127.0.0.1:8080/v1/ws (one per line: failover order)"));
    serversEdit_->setFixedHeight(70);
    QStringList lines;
    for (const QUrl &u : servers)
        lines << u.toString();
    if (lines.isEmpty() && !tokens.server.isEmpty())
        lines << tokens.server;
    serversEdit_->setPlainText(lines.join(QLatin1Char('\n')));
    form->addRow(tr("Servers:"), serversEdit_);

    dbEdit_ = new QLineEdit;
    dbEdit_->setObjectName(QStringLiteral("dbEdit"));
    dbEdit_->setPlaceholderText(tr("default: a per-user SQLite file in the app data dir"));
    form->addRow(tr("Database:"), dbEdit_);

    auto *caRow = new QHBoxLayout;
    caEdit_ = new QLineEdit;
    caEdit_->setObjectName(QStringLiteral("caFileEdit"));
    caEdit_->setPlaceholderText(tr("wss:// only: PEM CA to trust instead of the system store"));
    auto *caBrowse = new QPushButton(tr("Load..."));
    caRow->addWidget(caEdit_, 1);
    caRow->addWidget(caBrowse);
    form->addRow(tr("TLS CA file:"), caRow);
    connect(caBrowse, &QPushButton::clicked, this, [this] {
        const QString f = QFileDialog::getOpenFileName(this, tr("CA certificate"), caEdit_->text(),
                                                       tr("PEM (*.pem *.crt);;All files (*)"));
        if (!f.isEmpty())
            caEdit_->setText(f);
    });
    pinEdit_ = new QLineEdit;
    pinEdit_->setObjectName(QStringLiteral("pinEdit"));
    pinEdit_->setPlaceholderText(tr("wss:// only: server certificate SHA-256 (openssl x509 -fingerprint -sha256)"));
    form->addRow(tr("TLS pin:"), pinEdit_);

    note_ = new QLabel;
    note_->setObjectName(QStringLiteral("signInNote"));
    note_->setWordWrap(true);
    note_->setStyleSheet(QStringLiteral("color: #a05a00"));
    form->addRow(note_);

    auto *buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel);
    buttons->button(QDialogButtonBox::Ok)->setText(tr("Sign in"));
    connect(buttons, &QDialogButtonBox::accepted, this, &QDialog::accept);
    connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
    form->addRow(buttons);
    setLayout(form);
    resize(560, 480);

    connect(userList_, &QListWidget::currentRowChanged, this, &SignInDialog::updateNote);
    connect(userList_, &QListWidget::itemDoubleClicked, this, &SignInDialog::accept);
    connect(tokenEdit_, &QLineEdit::textChanged, this, &SignInDialog::updateNote);
    fillUsers(preferUser);
}

void SignInDialog::setDatabasePath(const QString &path) { dbEdit_->setText(path); }

void SignInDialog::setTlsSettings(const QString &caFile, const QString &pinSha256) {
    caEdit_->setText(caFile);
    pinEdit_->setText(pinSha256);
}

void SignInDialog::loadTokenFile(const QString &path) {
    QString err;
    TokenFile t;
    if (!t.load(path, &err)) {
        note_->setText(err);
        return;
    }
    tokens_ = t;
    tokenFileEdit_->setText(path);
    if (serversEdit_->toPlainText().trimmed().isEmpty() && !t.server.isEmpty())
        serversEdit_->setPlainText(t.server);
    fillUsers({});
}

void SignInDialog::fillUsers(const QString &preferUser) {
    userList_->clear();
    int pick = -1;
    for (int i = 0; i < tokens_.users.size(); ++i) {
        const DemoUser &u = tokens_.users.at(i);
        const bool open = openDevices_.contains(u.device);
        auto *item = new QListWidgetItem(QStringLiteral("%1  (device %2)%3").arg(u.user, u.device,
                                                                               open ? tr("  - window open") : QString()));
        item->setData(Qt::UserRole, u.user);
        userList_->addItem(item);
        if (pick < 0 && (u.user == preferUser || (preferUser.isEmpty() && !open)))
            pick = i;
    }
    if (pick >= 0)
        userList_->setCurrentRow(pick);
    updateNote();
}

void SignInDialog::updateNote() {
    if (!tokenEdit_->text().trimmed().isEmpty()) {
        note_->setText(tr("The pasted token is used; the user list is ignored."));
        return;
    }
    const int row = userList_->currentRow();
    if (row >= 0 && row < tokens_.users.size() && openDevices_.contains(tokens_.users.at(row).device)) {
        note_->setText(tr("Device %1 already has a window. A second window gets its own database and thus a new "
                          "install id: the server then treats the older window as a stale install "
                          "(STALE_INSTALL). Pick another user, or paste a token of another device.")
                           .arg(tokens_.users.at(row).device));
        return;
    }
    note_->clear();
}

void SignInDialog::accept() {
    Session s;
    QString bad;
    s.servers = parseServerList(serversEdit_->toPlainText(), &bad);
    if (s.servers.isEmpty()) {
        QMessageBox::warning(this, windowTitle(),
                             bad.isEmpty() ? tr("Give at least one server URL (ws://HOST:PORT/v1/ws).")
                                           : tr("Not a ws:// URL: %1").arg(bad));
        return;
    }
    const QString pasted = tokenEdit_->text().trimmed();
    if (!pasted.isEmpty()) {
        s.token = pasted;
    } else {
        const int row = userList_->currentRow();
        if (row < 0 || row >= tokens_.users.size()) {
            QMessageBox::warning(this, windowTitle(), tr("Pick a demo user or paste a token."));
            return;
        }
        const DemoUser &u = tokens_.users.at(row);
        s.token = u.token;
        s.user = u.user;
        s.device = u.device;
    }
    s.dbPath = dbEdit_->text().trimmed();
    s.caFile = caEdit_->text().trimmed();
    s.pinSha256 = pinEdit_->text().trimmed();
    const QString tlsProblem = checkTlsSettings(s.caFile, s.pinSha256);
    if (!tlsProblem.isEmpty()) {
        // Said in the dialog (not a modal box): the user fixes the field and
        // signs in again.
        note_->setText(tlsProblem);
        return;
    }
    session_ = s;
    QDialog::accept();
}
