// Export macro of the ImSdk library.
//
// Qt's convention: the library is shared unless said otherwise. A consumer
// of the shared library (the default build, and what the packages ship)
// defines nothing; one that links a static build of the SDK defines
// IM_SDK_STATIC (the CMake package and imsdk.pc add it for a static build).
// IM_SDK_BUILD is defined while the SDK itself is compiled.
#pragma once

#include <QtCore/qglobal.h>

#if defined(IM_SDK_STATIC)
#  define IM_SDK_EXPORT
#elif defined(IM_SDK_BUILD)
#  define IM_SDK_EXPORT Q_DECL_EXPORT
#else
#  define IM_SDK_EXPORT Q_DECL_IMPORT
#endif
