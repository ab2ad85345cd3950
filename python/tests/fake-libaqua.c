/* A library that calls itself libaqua of another ABI, for the version check at load time. */
__attribute__((visibility("default"))) const char *aqua_version(void)
{
        return "9.0.0";
}
